"""The document's component schemas: documents and their envelopes, problems, settings, the feed's.

Patterns and limits come from the checks themselves (``handlers.http.validation``,
``cache.collection_settings``), so the description cannot drift from them.
"""

from __future__ import annotations

from cache.collection_settings import MAX_REPLICAS, MAX_TTL
from cache.feed.streams import OPS
from cache.schemas.schema import DRAFT
from handlers import docs
from handlers.http import validation
from handlers.http.errors import PROBLEM_TYPE_PREFIX
from handlers.openapi.batch_schemas import batch_schemas
from handlers.openapi.import_schemas import import_schemas
from handlers.openapi.parts import Json, anchored, closed, ref
from handlers.openapi.problems import PROBLEM_TYPES


def schemas(max_ids: int) -> Json:
    """Every component schema."""
    return {
        **_documents(max_ids),
        **batch_schemas(),
        **import_schemas(),
        **_changes(),
        **_settings(),
        "Problem": _problem(),
    }


def _problem() -> Json:
    listed = "\n".join(f"- `{PROBLEM_TYPE_PREFIX}{slug}`: {meaning}" for slug, meaning in PROBLEM_TYPES)
    return closed(
        {
            "type": {"type": "string", "format": "uri", "description": "One of:\n" + listed},
            "title": {"type": "string", "description": "The reason phrase of `status`."},
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": {"type": "string", "description": "What went wrong with this request."},
            "trace_id": {
                "type": "string",
                "pattern": "^[0-9a-f]{32}$",
                "description": "With tracing on (JETWAY_TRACING_ENDPOINT): the request's W3C trace id, as its"
                " `traceparent` response header and its access line carry it (docs/tracing.md).",
            },
            "errors": {
                "type": "array",
                "maxItems": 20,
                "description": "`schema-violation` only: each way the document breaks its collection's schema"
                " (the first 20).",
                "items": closed(
                    {
                        "pointer": {"type": "string", "description": "RFC 6901 JSON Pointer into the document."},
                        "keyword": {"type": "string", "description": "The schema keyword that failed."},
                        "message": {"type": "string", "description": "What is wrong, for a person."},
                    },
                    ["pointer", "keyword", "message"],
                    "One schema violation.",
                ),
            },
        },
        ["type", "title", "status", "detail"],
        "An RFC 9457 problem detail.",
    )


def _documents(max_ids: int) -> Json:
    # additionalProperties spelled out: JSON Schema's default, but generators
    # read its absence as "no members" (openapi-typescript: Record<string, never>).
    document = {
        "type": "object",
        "additionalProperties": True,
        "description": "A JSON object; stored and returned as the exact bytes written.",
    }
    nullable_document = {"oneOf": [ref("schemas", "Document"), {"type": "null"}]}
    return {
        "CollectionName": {"type": "string", "pattern": anchored(validation.COLLECTION_PATTERN)},
        "DocumentId": {
            "type": "string",
            "pattern": anchored(validation.ID_PATTERN),
            "not": {"enum": [".", ".."]},
        },
        "Document": document,
        "DocsAsset": {"type": "string", "enum": list(docs.ASSET_NAMES), "description": "A file of the /docs page."},
        "IdList": closed(
            {"ids": {"type": "array", "items": ref("schemas", "DocumentId"), "maxItems": max_ids}},
            ["ids"],
            "Document ids to fetch in one round trip.",
        ),
        "MergePatch": {
            "type": "object",
            "additionalProperties": True,
            "description": "An RFC 7396 merge patch; it must be an object here.",
        },
        "Page": closed(
            {
                "items": {"type": "array", "items": ref("schemas", "Document")},
                "next": {"type": ["string", "null"], "description": "The `cursor` of the next page; null on the last."},
            },
            ["items", "next"],
            "A page of documents in id order.",
        ),
        "Items": closed(
            {"items": {"type": "array", "items": nullable_document, "description": "In `ids` order; null if missing."}},
            ["items"],
            "Documents by id.",
        ),
    }


def _settings_schema() -> Json:
    return closed(
        {
            "schema": {
                "type": "object",
                "additionalProperties": True,
                "description": f"A JSON Schema ({DRAFT}) every written document must match (PUT, POST, and the"
                " merged result of PATCH).",
            },
            "ttl": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TTL,
                "description": "Seconds a document lives when its write gives no `ttl`.",
            },
            "max_bytes": {"type": "integer", "minimum": 2, "description": "Largest document of the collection."},
            "cache_control": {
                "type": "string",
                "minLength": 1,
                "maxLength": 256,
                "description": "The `Cache-Control` of the collection's document reads and list pages, in place of"
                " `JETWAY_CACHE_CONTROL` (the same directives are accepted; stored normalized).",
            },
            "write_replicas": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_REPLICAS,
                "description": "Replicas that must have a write before it is answered (instead of"
                " `JETWAY_WRITE_REPLICAS`).",
            },
            "indexes": {
                "type": "object",
                "additionalProperties": True,
                "description": 'Declared indexes, by name: `{"<name>": {"fields": [{"name", "pointer", "type"}]}}`'
                " (docs/api.md, queries).",
            },
            "owner": closed(
                {
                    "pointer": {"type": "string", "description": "The JSON Pointer of the member naming the owner."},
                    "claim": {"type": "string", "description": "The caller's claim it must equal (default `sub`)."},
                    "bypass": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Who the rule does not bind: `service` (Jetway's own tokens), `admin`, or"
                        ' scopes (default `["admin", "service"]`).',
                    },
                    "fill": {
                        "type": "boolean",
                        "description": "A create without the member gets it from the claim (default true).",
                    },
                },
                ["pointer"],
                "A per-document rule: a user (an OpenID Connect token) sees and writes only the documents whose"
                " member names them; another's is answered as a missing one (docs/identity.md).",
            ),
        },
        (),
        "A collection's settings; every member is optional, and an absent one changes nothing.",
    )


def _settings() -> Json:
    listed = closed(
        {
            "items": {
                "type": "array",
                "items": closed(
                    {
                        "collection": ref("schemas", "CollectionName"),
                        "etag": {"type": "string"},
                        "settings": ref("schemas", "CollectionSettings"),
                    },
                    ["collection", "etag", "settings"],
                    "One collection's settings.",
                ),
            }
        },
        ["items"],
        "Every collection that has settings, by name.",
    )
    return {"CollectionSettings": _settings_schema(), "CollectionSettingsList": listed}


def _changes() -> Json:
    event = closed(
        {
            "op": {
                "enum": [op.decode() for op in OPS],
                "description": "What the write did; `expire`: the document's TTL ran out (docs/api.md, \"The"
                ' change feed").',
            },
            "id": ref("schemas", "DocumentId"),
            "etag": {
                "type": ["string", "null"],
                "description": "The document's new ETag; null for a delete or an expiry.",
            },
            "time": {"type": "string", "format": "date-time", "description": "When Redis stored it (UTC, ms)."},
            "expired_at": {
                "type": "string",
                "format": "date-time",
                "description": "An `expire` event's only: when the document's TTL ran out (UTC, ms).",
            },
            "trace": {
                "type": "string",
                "pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
                "description": "With tracing on, a write sampled for it only: the W3C `traceparent` of the request"
                " that wrote it (its trace id, then its span's), so a consumer can link its own work to the write"
                ' (docs/tracing.md, "The trace id elsewhere").',
            },
            "matches": {
                "type": "boolean",
                "description": "In a live query's events only: whether the document matches the query after this"
                " write (false: it matched before, and no longer does).",
            },
            "doc": {
                "oneOf": [ref("schemas", "Document"), {"type": "null"}],
                "description": "With `include_docs`: the document as it is now, null if it is gone.",
            },
        },
        ["op", "id", "etag", "time"],
        "One write. A document's events come in the order of its writes, each once.",
    )
    page = closed(
        {
            "events": {"type": "array", "items": ref("schemas", "ChangeEvent")},
            "next": {"type": "string", "description": "The position after these events: the next `since`."},
        },
        ["events", "next"],
        "A long poll's page of changes.",
    )
    ticket = closed(
        {
            "ticket": {"type": "string", "description": "Send as `?ticket=`; a secret, like the token."},
            "expires_at": {"type": "string", "format": "date-time"},
        },
        ["ticket", "expires_at"],
        "A read-only credential for one collection's change feed.",
    )
    return {"ChangeEvent": event, "ChangesPage": page, "Ticket": ticket}
