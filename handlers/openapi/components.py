"""The document's shared parameters, headers and security schemes.

Limits come from the checks themselves (``handlers.http.validation``) and from
the settings the generator is given (``max_ids``, the feed's ``max_wait``).
"""

from __future__ import annotations

from typing import Any

from handlers.base import RETRY_AFTER_SECONDS
from handlers.http import validation
from handlers.openapi.parts import Json, parameter, ref
from handlers.paths import MULTI_GET


def parameters(max_ids: int, max_wait: int) -> Json:
    """Every component parameter."""
    return {**_parameters(max_ids), **_changes_parameters(max_wait)}


def security_schemes() -> Json:
    return {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token made with `python -m api keys create`; only its SHA-256 is stored.",
        },
        "ticket": _TICKET_SCHEME,
    }


def _parameters(max_ids: int) -> Json:
    def integer(low: int, high: int, **extra: Any) -> Json:
        return {"type": "integer", "minimum": low, "maximum": high, **extra}

    tags = {"type": "string"}
    return {
        "collection": parameter(
            "collection", "path", "A collection name.", ref("schemas", "CollectionName"), required=True
        ),
        "id": parameter("id", "path", "A document id.", ref("schemas", "DocumentId"), required=True),
        "asset": parameter(
            "asset",
            "path",
            "A file of the /docs page.",
            ref("schemas", "DocsAsset"),
            required=True,
        ),
        "ttl": parameter(
            "ttl",
            "query",
            "Seconds until the document expires. Without it the document never expires "
            "(a PUT removes any earlier expiry).",
            integer(1, validation.MAX_TTL),
        ),
        # No `default` in the schema: generated clients would send it with every
        # request, `ids` or not; the description says what absence means.
        "limit": parameter(
            "limit",
            "query",
            f"Page size; {validation.DEFAULT_LIMIT} when absent. Beside `ids` it is ignored, unless it is less than"
            " the number of ids (a 400: a multi-get answers every id).",
            integer(1, validation.MAX_LIMIT),
        ),
        "cursor": parameter(
            "cursor", "query", "Where to continue: the `next` of the previous page.", {"type": "string"}
        ),
        "order": parameter(
            "order",
            "query",
            "A query's order: `field.asc` or `field.desc`, a field of the collection's declared indexes (the"
            " ranged one, if any). A query (`field=op.value` filters, `order`) is answered by a declared index:"
            " `op` is `eq`, `gt`, `gte`, `lt`, `lte`, `in` (`in.(a,b)`) or, on a string field, `like` (a prefix:"
            " `like.abc*`), the value read as the field's declared type; equality (or `in`, on one field) on an"
            " index's first fields, a range (or a prefix) and/or the"
            " order on its next one. Filters are ANDed; `limit` and `cursor` page through it. No index answers:"
            " a 400 `no-index` names the index to declare; an operator Jetway does not know is a 400"
            " `invalid-query`, never ignored.",
            {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*(\\.(asc|desc))?$"},
        ),
        "with_ids": parameter(
            "with_ids",
            "query",
            'NDJSON only: each line is `{"id":"<id>","doc":<document>}` (`1`), not the bare document (`0`, the'
            " default); the import reads the same form back with `with_ids=1`, the document's bytes as they are.",
            {"type": "string", "enum": ["0", "1", "false", "true"]},
        ),
        "ids": parameter(
            "ids",
            "query",
            "Document ids to fetch in one round trip, comma-separated (`ids=a,b`), repeated (`ids=a&ids=b`) or"
            f" both, up to {max_ids} in all; not with `cursor`. The request line (8 KiB, and often less through"
            " proxies) bounds how many fit: about 60 ids of 128 characters, 700 of 10;"
            f" `POST {MULTI_GET}` takes up to {max_ids} in a body.",
            {"type": "array", "items": ref("schemas", "DocumentId"), "minItems": 1, "maxItems": max_ids},
            style="form",
            explode=False,
        ),
        "If-Match": parameter(
            "If-Match", "header", "`*` or strong entity tags: act only if one matches (a weak tag never does).", tags
        ),
        "Idempotency-Key": parameter(
            "Idempotency-Key",
            "header",
            "A key of the client's making (draft-ietf-httpapi-idempotency-key-header), 1 to 255 printable ASCII"
            " characters, quoted or not: a retry with the same key and request gets the first response again,"
            " and nothing is written twice, also after a crash. Kept 24 hours per token.",
            {"type": "string", "maxLength": 257},
        ),
        "If-Modified-Since": parameter(
            "If-Modified-Since",
            "header",
            "An HTTP-date: 304 if the document was not written after it. Ignored with `If-None-Match`.",
            {"type": "string"},
        ),
        "If-Unmodified-Since": parameter(
            "If-Unmodified-Since",
            "header",
            "An HTTP-date: 412 if the document was written after it. Ignored with `If-Match` or when the"
            " document does not exist.",
            {"type": "string"},
        ),
        "Accept-Encoding": parameter(
            "Accept-Encoding",
            "header",
            "Content codings the client decodes, with q-values (RFC 9110 12.5.3). Documents of at least"
            " `JETWAY_COMPRESS_MIN_BYTES` are stored with a `gzip` variant, sent as stored, and list pages and"
            " multi-gets that large are gzipped as they are sent; without this header the stored bytes are sent;"
            " `identity;q=0` with nothing else available accepted is a 406.",
            {"type": "string"},
        ),
        "Prefer": parameter(
            "Prefer",
            "header",
            "`return=minimal`: a batch's write results carry no `document` (RFC 7240).",
            {"type": "string"},
        ),
        "PreferCount": parameter(
            "Prefer",
            "header",
            "`count=exact`: the page's `Content-Range` gives the total of the query's (or the list's) documents,"
            " counted from the index without reading any (`0-19/3573`, `*/0` when empty), each index shard exact"
            " when it is counted; `count=estimated` the same without first expiring documents past their expiry"
            " (some may be counted). Named in `Preference-Applied`. Other preferences are ignored (RFC 7240)"
            " unless `handling=strict`: a 400 `invalid-preference`.",
            {"type": "string", "examples": ["count=exact"]},
        ),
        "If-None-Match": parameter(
            "If-None-Match",
            "header",
            "`*` or entity tags, compared weakly. GET/HEAD: 304 if one matches. PUT: 412 if one matches "
            "(`*`: create only).",
            tags,
        ),
    }


def _changes_parameters(max_wait: int) -> Json:
    return {
        "since": parameter(
            "since",
            "query",
            "A position (an event's `id:`, or a page's `next`): the events after it. From now when absent. A"
            " stream's `Last-Event-ID` takes precedence.",
            {"type": "string"},
        ),
        "wait": parameter(
            "wait",
            "query",
            "Long poll: seconds to wait for an event when there is none yet; 0 (answer at once) when absent.",
            {"type": "integer", "minimum": 0, "maximum": max_wait},
        ),
        "changesLimit": parameter(
            "limit",
            "query",
            f"Long poll: the most events in a page; {validation.DEFAULT_LIMIT} when absent.",
            {"type": "integer", "minimum": 1, "maximum": validation.MAX_LIMIT},
        ),
        "include_docs": parameter(
            "include_docs",
            "query",
            "Each event carries `doc`: the document's stored bytes as they are now (null once deleted).",
            {"type": "boolean"},
        ),
        "Last-Event-ID": parameter(
            "Last-Event-ID",
            "header",
            "A stream resumes after this position (an `EventSource` sends it when it reconnects).",
            {"type": "string"},
        ),
    }


def headers() -> Json:
    def header(description: str, required: bool = True, **schema: Any) -> Json:
        # `required`: on every response that lists the header (tests/handlers/test_openapi.py checks real responses).
        return {"description": description, "required": required, "schema": {"type": "string", **schema}}

    return {
        "ETag": header(
            "The document's strong entity tag; it changes on every write. A compressed variant's tag is the"
            " document's with `-<coding>` inside the quotes; `If-Match` and `If-None-Match` take either.",
        ),
        "Cache-Control": header(
            "How caches may keep the response: for documents, list pages and multi-gets the operator's policy"
            " (`JETWAY_CACHE_CONTROL`, default `no-cache`: keep, but revalidate with the ETag); for `/docs`"
            " assets named by their content, a year. Problem responses carry `no-store`.",
            examples=["no-cache"],
        ),
        "Vary": header(
            "`Accept-Encoding` when the document has compressed variants (on list pages and multi-gets whenever"
            " compression is on); `Origin` beside it when `JETWAY_CORS_ORIGINS` lists origins; `Prefer` on a"
            " counted page.",
            required=False,
        ),
        "Content-Encoding": header("`gzip` when the body is sent compressed.", required=False),
        "Content-Range": header(
            "With `Prefer: count=exact` (or `estimated`): the page's first and last positions among all the"
            " query's (or the list's) documents, and their total, as PostgREST gives it: `0-19/3573`; `*/3573` for"
            " an empty page. The first position is the documents before the cursor, counted with the total.",
            required=False,
            pattern="^([0-9]+-[0-9]+|[*])/[0-9]+$",
            examples=["0-19/3573"],
        ),
        "Preference-Applied": header(
            "The count `Prefer` asked and the page's `Content-Range` gives (RFC 7240).",
            required=False,
            examples=["count=exact"],
        ),
        "Idempotency-Replayed": header(
            "`true` when the response is the stored answer to an earlier request with the same `Idempotency-Key`.",
            required=False,
        ),
        "X-Request-ID": header(
            "The request's id: the client's own `X-Request-ID` when it sent a valid one, else one the worker made;"
            " its access log line carries it too. Every response has one but a refusal of a request whose head or"
            " body could not be read (a 408, 413, 414 or 431 that closes the connection: no handler saw it).",
            required=False,
        ),
        "traceparent": header(
            "With tracing on (`JETWAY_TRACING_ENDPOINT`): the W3C trace context of the request's span, in the"
            " client's trace when it sent a valid `traceparent`; flag `00` when it was not sampled (docs/tracing.md).",
            required=False,
            pattern="^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        ),
        "Last-Modified": header("When the document was last written (HTTP date)."),
        "Location": header("The path of the new document.", examples=["/v1/orders/01J0000000000000000000000"]),
        "Retry-After": header("Seconds to wait before retrying.", pattern="^[0-9]+$", examples=[RETRY_AFTER_SECONDS]),
        "Allow": header("The methods the path supports.", examples=["GET, HEAD, POST"]),
        "Index-Builds": header(
            "When the settings declare indexes: each one's index shards built, of all (`16/16`: it answers"
            " queries; less: it is being built, and its queries answer 409 `index-building`).",
            required=False,
            examples=["by_email=16/16, by_customer_created=5/16"],
        ),
        "WWW-Authenticate": header("The scheme to authenticate with.", examples=['Bearer realm="jetway"']),
        "RateLimit-Limit": header("Requests the token may make per period (its burst).", pattern="^[0-9]+$"),
        "RateLimit-Remaining": header("Requests left right now.", pattern="^[0-9]+$"),
        "RateLimit-Reset": header("Seconds until the full allowance is back.", pattern="^[0-9]+$"),
        "Content-Security-Policy": header("What the page may load: only from this origin."),
    }


_TICKET_SCHEME = {
    "type": "apiKey",
    "in": "query",
    "name": "ticket",
    "description": "A ticket from `POST /v1/_changes/{collection}/tickets`: `GET` of that collection's feed only.",
}
