"""The operation table: every operation of the API, declared once.

Each entry says how an operation is routed (its path and the Cyclone handler),
what a token needs (``scope``: the one admission reads it), how its body is
read (``intake``) and how it is documented. Cyclone's routes, the connection's
body limits and ``/openapi.json`` are derived from it (``api/app.py`` hands
it the table). A new operation is one more entry here. Path templates come
from ``handlers.paths``; the shared error texts from ``handlers.openapi``.
"""

from __future__ import annotations

from typing import Tuple

from handlers.changes import EVENT_STREAM
from handlers.http.validation import JSON, MERGE_PATCH_JSON
from handlers.imports import NDJSON
from handlers.openapi.parts import parameter
from handlers.openapi.problems import FEED_OFF, KEY_IN_USE, KEY_REUSED, LOST, REDIS, STORED_REFUSED, STREAM
from handlers.openapi.problems import RESPONSE_TOO_LARGE as TOO_LARGE
from handlers.operation import BATCH_BODY, STREAMED_BODY, Body, Operation, Response
from handlers.resources import (
    BATCH,
    CHANGES,
    COLLECTION,
    DOCUMENT,
    IMPORT,
    MULTI_GET,
    SETTINGS,
    SETTINGS_LIST,
    TICKETS,
)
from handlers.service_operations import SERVICE_OPERATIONS

R = Response
STORED = ("ETag", "Last-Modified")
FEED = ("bearer", "ticket")  # a feed is followed with a token, or a browser's ticket

_REPLAYED = "(with an `Idempotency-Key`, perhaps the first attempt's answer again, marked `Idempotency-Replayed`)."
_ADMIN = "The token lacks the `admin` scope."
_SETTINGS_STORED = R("The settings as stored.", "CollectionSettings", ("ETag",))
_SETTINGS_READ = R(
    "The settings as stored; with `Index-Builds` when they declare indexes.",
    "CollectionSettings",
    ("ETag", "Index-Builds"),
    optional=("Index-Builds",),
)
_DOCUMENT_BODY = Body(JSON, "The document, stored verbatim once validated.", "Document")

OPERATIONS: Tuple[Operation, ...] = (
    Operation(
        MULTI_GET,
        "POST",
        "getDocuments",
        "Many documents by id, the ids in the body: any list the GET form's request line cannot hold",
        "collections",
        "read",
        {
            200: R(
                "The documents in the order asked, null where missing; gzipped as they are sent when"
                " `Accept-Encoding` prefers gzip and they are at least `JETWAY_COMPRESS_MIN_BYTES`.",
                "Items",
                ("Cache-Control", "Vary", "Content-Encoding"),
            )
        },
        (400, 406, 413, 415, *REDIS),
        {
            400: 'Invalid collection name or id (named), too many ids, malformed JSON, or not `{"ids": [...]}`.',
            413: "The body is larger than `JETWAY_MAX_BODY`; or " + TOO_LARGE,
        },
        parameters=("Accept-Encoding",),
        body=Body(JSON, "The ids to fetch; duplicates are answered in place.", "IdList"),
    ),
    Operation(
        TICKETS,
        "POST",
        "createChangesTicket",
        "A ticket to follow this collection's feed by `?ticket=` (for `EventSource`)",
        "changes",
        "read",
        {
            201: R(
                "Issued: good for `GET` of this collection's feed only, until `expires_at`"
                " (`JETWAY_FEED_TICKET_TTL`, default an hour), and only while the token that asked for it is"
                " valid (revoking or rotating the token ends its tickets). `Cache-Control: no-store`.",
                "Ticket",
                ("Cache-Control",),
            )
        },
        (400, 404, *REDIS),
        {400: "Invalid collection name.", 403: "The token lacks read scope on the collection.", 404: FEED_OFF},
        security=FEED,
    ),
    Operation(
        CHANGES,
        "GET",
        "getChanges",
        "Follow a collection's changes: Server-Sent Events (`Accept: text/event-stream`) or a long poll; with"
        " a query's filters (`?status=eq.open`), a live query: its documents' events, each with `matches`",
        "changes",
        "read",
        {
            200: R(
                STREAM,
                headers=("Cache-Control",),
                content={
                    JSON: {"schema": {"$ref": "#/components/schemas/ChangesPage"}},
                    EVENT_STREAM: {"schema": {"type": "string", "description": "A stream of Server-Sent Events."}},
                },
            )
        },
        (400, 404, 410, *REDIS),
        {
            400: "Invalid collection name, `since`, `Last-Event-ID`, `wait`, `limit` or `include_docs`; a live"
            " query no declared index answers (`no-index`), or that is malformed or asks an order (`invalid-query`).",
            401: "No valid bearer token or ticket: missing, unknown, revoked, rotated or expired (never said which).",
            403: "The token (or the ticket's token) lacks read scope on the collection, or the ticket is another's.",
            404: FEED_OFF,
            410: LOST,
        },
        parameters=("since", "wait", "changesLimit", "include_docs", "Last-Event-ID"),
        security=FEED,
    ),
    Operation(
        BATCH,
        "POST",
        "runBatch",
        "Many document operations in one request, each answered as it would be alone (not atomic)",
        "batch",
        "token",
        {
            200: R(
                "Every operation was carried out or refused on its own; see each result's `status`. A write"
                " whose replicas did not confirm it has a 503 `not-replicated` result. A get whose document would"
                " take the gets' documents past `JETWAY_MAX_RESPONSE_BYTES` has a 413 `response-too-large` result"
                " (the others go on). With an `Idempotency-Key`,"
                " perhaps the first attempt's answer again, marked `Idempotency-Replayed`.",
                "BatchResults",
                ("Idempotency-Replayed",),
            )
        },
        # No 403: each operation's scope is checked in its own result.
        (400, 401, 409, 413, 415, 422, 429, 500, 502, 503, 504),
        {
            400: 'Malformed JSON, not `{"operations": [...]}`, an empty list, or an invalid `Idempotency-Key`.'
            " An operation that is malformed on its own is refused in its result, not here.",
            409: KEY_IN_USE,
            413: "More operations than `JETWAY_MAX_BATCH_OPS` or than the token's burst (`batch-too-large`),"
            " or a body over `JETWAY_MAX_BATCH_BYTES` (`body-too-large`); nothing done.",
            422: KEY_REUSED,
            429: "Over the token's rate: a batch costs one request per operation.",
        },
        parameters=("Idempotency-Key", "Prefer"),
        body=Body(JSON, "The operations, in order.", "BatchRequest"),
        intake=BATCH_BODY,
    ),
    Operation(
        IMPORT,
        "POST",
        "importDocuments",
        "Write documents from NDJSON (one per line) as the body arrives, in bounded memory, resumably",
        "collections",
        "write",
        {200: R("The body was read whole; every line was written or refused (`refusals`).", "ImportReport")},
        (400, 408, 409, 415, *REDIS),
        {
            409: "An import with this `Idempotency-Key` is running (see `Retry-After`), or this one lost its lease.",
            400: "Invalid collection name, `id`, `with_ids`, `from_line`, `ttl` or `Idempotency-Key`; or a malformed"
            " chunk. An import cut short reports what it wrote (`last_line`, `resume_from_line`).",
            408: "The body stopped arriving for `JETWAY_BODY_TIMEOUT`, or fell below `JETWAY_BODY_MIN_RATE`.",
        },
        parameters=(
            parameter("id", "query", "A JSON Pointer to each line's id (a string), e.g. `/id`.", {"type": "string"}),
            parameter("id_field", "query", "Each line's id is this top-level member.", {"type": "string"}),
            parameter(
                "from_line",
                "query",
                "Skip the lines before this one (from 1): resume an upload cut short.",
                {"type": "integer", "minimum": 1},
            ),
            "with_ids",
            "ttl",
            "Idempotency-Key",
        ),
        body=Body(NDJSON, "Documents, one JSON object per line; each checked as a PUT's body is.", "NdjsonDocuments"),
        intake=STREAMED_BODY,
    ),
    Operation(
        SETTINGS,
        "GET",
        "getCollectionSettings",
        "A collection's settings",
        "settings",
        "admin",
        {
            200: _SETTINGS_READ,
            304: R(
                "`If-None-Match` matches the current ETag.",
                headers=("ETag", "Index-Builds"),
                optional=("Index-Builds",),
            ),
        },
        (400, 404, *REDIS),
        {400: "Invalid collection name.", 404: "The collection has no settings.", 403: _ADMIN},
        parameters=("If-None-Match",),
        head="headCollectionSettings",
    ),
    Operation(
        SETTINGS,
        "PUT",
        "putCollectionSettings",
        "Set a collection's settings (every worker applies them within a second)",
        "settings",
        "admin",
        {200: _SETTINGS_STORED, 201: _SETTINGS_STORED},
        (400, 412, 413, 415, 422, *REDIS),
        {
            400: "Invalid collection name; malformed JSON; or not an object.",
            412: "`If-Match` does not match, or `If-None-Match: *` and settings exist.",
            422: "`invalid-schema`: not a Draft 2020-12 schema (the detail says why); `invalid-settings`: an"
            " unknown member or a value out of range.",
            403: _ADMIN,
        },
        parameters=("If-Match", "If-None-Match"),
        body=Body(JSON, "The settings; they replace any before.", "CollectionSettings"),
    ),
    Operation(
        SETTINGS,
        "DELETE",
        "deleteCollectionSettings",
        "Remove a collection's settings (its documents stay)",
        "settings",
        "admin",
        {204: R("Removed.")},
        (400, 404, 412, *REDIS),
        {400: "Invalid collection name.", 404: "No settings to remove.", 403: _ADMIN},
        parameters=("If-Match",),
    ),
    Operation(
        SETTINGS_LIST,
        "GET",
        "listCollectionSettings",
        "Every collection's settings",
        "settings",
        "admin",
        {200: R("By collection name.", "CollectionSettingsList")},
        (400, *REDIS),
        {400: "Never, in fact: there is nothing to get wrong.", 403: _ADMIN},
        head="headCollectionSettingsList",
    ),
    Operation(
        DOCUMENT,
        "GET",
        "getDocument",
        "Read a document: the stored bytes, verbatim, or a compressed variant stored with them",
        "documents",
        "read",
        {
            200: R(
                "The document, exactly as it was stored; or, when `Accept-Encoding` prefers one that is stored"
                " (documents of at least `JETWAY_COMPRESS_MIN_BYTES`), its compressed variant with"
                " `Content-Encoding` and an ETag of its own. `Vary: Accept-Encoding` when variants are stored.",
                "Document",
                (*STORED, "Cache-Control", "Vary", "Content-Encoding"),
            ),
            304: R(
                "`If-None-Match` names the document (any variant's ETag does), or, without `If-None-Match`,"
                " it was not modified since `If-Modified-Since`.",
                headers=("ETag", "Cache-Control", "Vary"),
            ),
        },
        (400, 404, 406, *REDIS),
        {400: "Invalid collection name or document id."},
        parameters=("If-None-Match", "If-Modified-Since", "Accept-Encoding"),
        head="headDocument",
        pipeline="read",
    ),
    Operation(
        DOCUMENT,
        "PUT",
        "putDocument",
        "Create or replace a document",
        "documents",
        "write",
        {
            200: R("Replaced; the body is the document as stored.", "Document", STORED),
            201: R("Created; the body is the document as stored.", "Document", STORED),
        },
        (400, 409, 412, 413, 415, 422, 507, *REDIS),
        {
            400: "Invalid collection name, document id or `ttl`; malformed JSON; or not an object.",
            409: STORED_REFUSED,
            412: "`If-Match` does not match, or `If-None-Match` matches (`*`: the document exists).",
        },
        replicated=("ETag",),
        parameters=("If-Match", "If-None-Match", "If-Unmodified-Since", "ttl"),
        body=_DOCUMENT_BODY,
        pipeline="replace",
    ),
    Operation(
        DOCUMENT,
        "PATCH",
        "patchDocument",
        "Merge-patch a document (RFC 7396), atomically against concurrent writers",
        "documents",
        "write",
        {
            200: R(
                "Patched; the body is the compact serialization of the merged document " + _REPLAYED,
                "Document",
                (*STORED, "Idempotency-Replayed"),
            )
        },
        (400, 404, 409, 412, 413, 415, 422, 507, *REDIS),
        {
            400: "Invalid collection name or document id; malformed JSON; or the patch is not an object.",
            412: "`If-Match` does not match the current ETag.",
            413: "The patch, or the merged document, is larger than `JETWAY_MAX_BODY` bytes (default 1 MiB).",
            415: "The body is not labelled `application/merge-patch+json` (`charset=utf-8` allowed).",
            409: "The merge patch lost the race to concurrent writers too many times; retry. Or: "
            + KEY_IN_USE
            + " Or: "
            + STORED_REFUSED,
            422: "The merged document breaks its collection's JSON Schema (`schema-violation`, with `errors`),"
            " or cannot be serialized as JSON (e.g. a number beyond the range of a double; `unrepresentable`)."
            " Or: " + KEY_REUSED,
        },
        replicated=("ETag",),
        parameters=("If-Match", "If-Unmodified-Since", "Idempotency-Key"),
        body=Body(MERGE_PATCH_JSON, "A JSON Merge Patch: `null` removes a member.", "MergePatch"),
    ),
    Operation(
        DOCUMENT,
        "DELETE",
        "deleteDocument",
        "Delete a document",
        "documents",
        "write",
        {204: R("Deleted.")},
        (400, 404, 412, *REDIS),
        {400: "Invalid collection name or document id."},
        replicated=(),
        parameters=("If-Match", "If-Unmodified-Since"),
    ),
    Operation(
        COLLECTION,
        "GET",
        "listDocuments",
        "A page of documents in id order (`limit`, `cursor`), many documents by id (`ids`), or a query over a"
        " declared index (`field=op.value`, `order`)",
        "collections",
        "read",
        {
            200: R(
                "A `Page` without `ids`, `Items` with `ids`; gzipped as it is sent when `Accept-Encoding` prefers"
                " gzip and it is at least `JETWAY_COMPRESS_MIN_BYTES`. A weak `ETag` names its content. With"
                " `Accept: application/x-ndjson`, every document after `cursor` in id order, streamed (`limit` does"
                " not apply): a body that ends without its last chunk was cut short; resume after its last id.",
                headers=("ETag", "Cache-Control", "Vary", "Content-Encoding", "Content-Range", "Preference-Applied"),
                optional=("ETag",),  # not on an NDJSON export
                content={
                    JSON: {
                        "schema": {
                            "oneOf": [{"$ref": "#/components/schemas/Page"}, {"$ref": "#/components/schemas/Items"}]
                        }
                    },
                    NDJSON: {"schema": {"$ref": "#/components/schemas/NdjsonDocuments"}},
                },
            ),
            304: R(
                "`If-None-Match` names the page's weak ETag: its content has not changed.",
                headers=("ETag", "Cache-Control", "Vary"),
            ),
        },
        (400, 406, 409, 413, *REDIS),
        {
            400: "Invalid collection name, `limit`, `cursor`, `with_ids` or `ids`; `ids` with `cursor`, or with a"
            " `limit` less than their number; a query's filters malformed (`invalid-query`) or answered by no"
            " declared index (`no-index`); `Prefer: handling=strict` with one not applied (`invalid-preference`).",
            409: "The query's index is being built (`index-building`); retry after `Retry-After`.",
            413: TOO_LARGE,
        },
        parameters=("limit", "cursor", "order", "ids", "with_ids", "If-None-Match", "Accept-Encoding", "PreferCount"),
        head="headCollection",
    ),
    Operation(
        COLLECTION,
        "POST",
        "createDocument",
        "Create a document under a new, sortable id (a ULID)",
        "collections",
        "write",
        {
            201: R(
                "Created; the body is the document as stored " + _REPLAYED,
                "Document",
                ("Location", *STORED, "Idempotency-Replayed"),
            )
        },
        (400, 409, 413, 415, 422, 507, *REDIS),
        {
            400: "Invalid collection name, `ttl` or `Idempotency-Key`; malformed JSON; or not an object.",
            409: KEY_IN_USE + " Or: " + STORED_REFUSED,
            422: "The document breaks its collection's JSON Schema (`schema-violation`, with `errors`). Or: "
            + KEY_REUSED,
        },
        replicated=("ETag", "Location"),
        parameters=("ttl", "Idempotency-Key"),
        body=_DOCUMENT_BODY,
    ),
    *SERVICE_OPERATIONS,
)
