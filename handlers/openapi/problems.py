"""The problem catalog: every problem type the API answers, and what each error status means.

The statuses' descriptions are the defaults an operation's ``errors`` get
(``handlers.operation.Operation.details`` rewords one for an operation);
the texts below them are shared by several operations' rewordings, or
too long to read inside the table (the change feed's stream).
"""

from __future__ import annotations

from typing import Dict, Tuple

from handlers.feed.event_stream import HEARTBEAT_SECONDS, RETRY_MS

# Every problem type the handlers raise, and when.
PROBLEM_TYPES: Tuple[Tuple[str, str], ...] = (
    ("invalid-collection", "400: the collection name does not match its pattern"),
    ("invalid-id", "400: a document id (in the path or in `ids`) does not match its pattern"),
    (
        "invalid-id-source",
        "400: an import's `id` is not a JSON Pointer, or more than one of `id`, `id_field` and `with_ids` is given",
    ),
    ("invalid-with-ids", "400: `with_ids` (an NDJSON export's or import's) is not `1`, `0`, `true` or `false`"),
    ("not-an-id-and-doc", '400 (an import\'s line, with `with_ids=1`): the line is not `{"id": ..., "doc": {...}}`'),
    ("invalid-from-line", "400: an import's `from_line` is not a line number"),
    ("missing-id", "400 (an import's line): the line has no member where its id should be"),
    ("line-too-large", "413 (an import's line): the line is larger than `JETWAY_MAX_BODY`"),
    ("invalid-ttl", "400: `ttl` is not a whole number in range, or is given twice"),
    ("invalid-limit", "400: `limit` is not a whole number in range, or is given twice"),
    ("invalid-cursor", "400: `cursor` is not one this API made, or is given twice"),
    ("invalid-ids", "400: too many `ids`, `ids` with `cursor`, or with a `limit` less than their number"),
    (
        "invalid-preference",
        "400: `Prefer` says `handling=strict` beside a preference Jetway does not apply there (a list page or a"
        " query applies `count=exact` and `count=estimated`)",
    ),
    (
        "invalid-query",
        "400: a query's filter is not `op.value` with a value of its field's type, two bounds on one side, ranges on"
        " two fields, an `order` on another field than the range's, or `ids` beside filters",
    ),
    (
        "no-index",
        "400: no declared index answers the query (never a scan); `detail` names the index to declare in the"
        " collection's settings",
    ),
    (
        "index-building",
        "409: the query's index is being built over the documents already there; retry after `Retry-After`",
    ),
    (
        "not-indexable",
        "422: the collection declares indexes and Redis cannot read the document to index it (nested past 1,000"
        " levels, a lone surrogate escape); nothing was written",
    ),
    ("malformed-json", "400: the body is not UTF-8 RFC 8259 JSON"),
    ("not-an-object", "400: the body is JSON but not an object"),
    ("unauthorized", "401: no valid bearer token"),
    ("forbidden", "403: the token lacks the scope for this collection and action"),
    ("not-found", "404: no such document"),
    ("no-route", "404: no resource at this path"),
    ("method-not-allowed", "405: the path does not support the method; see `Allow`"),
    ("write-conflict", "409: a merge patch lost the race to concurrent writers; retry"),
    ("invalid-idempotency-key", "400: `Idempotency-Key` is not a string of 1 to 255 printable ASCII characters"),
    (
        "idempotency-key-in-use",
        "409: a request with this `Idempotency-Key` is still being carried out; see `Retry-After`",
    ),
    ("idempotency-key-reused", "422: this `Idempotency-Key` was used for a different request"),
    ("not-acceptable", "406: `Accept-Encoding` refuses every coding the document is stored in (`identity;q=0`)"),
    ("precondition-failed", "412: an `If-Match`, `If-None-Match` or `If-Unmodified-Since` condition does not hold"),
    ("invalid-batch", '400: not `{"operations": [...]}`, or a batch operation malformed on its own (in its result)'),
    ("batch-too-large", "413: more batch operations than `JETWAY_MAX_BATCH_OPS` or than the token's burst"),
    ("body-too-large", "413: the body, or the merged document, is larger than the limit"),
    (
        "response-too-large",
        "413: the documents asked for (a multi-get, or a batch's gets; each counted as often as asked) add up to"
        " more than `JETWAY_MAX_RESPONSE_BYTES`; `size` and `limit` say by how much. Nothing was read",
    ),
    ("unsupported-media-type", "415: the body is not labelled with the media type the operation takes"),
    ("unrepresentable", "422: the merged document cannot be serialized as JSON (e.g. a number out of range)"),
    (
        "schema-violation",
        "422: the document (on PATCH, the merged document) breaks its collection's JSON Schema; `errors` lists where",
    ),
    ("invalid-schema", "422: collection settings whose `schema` is not a valid Draft 2020-12 JSON Schema"),
    (
        "stored-schema-refused",
        "409: a write to a collection whose stored schema (stored by an earlier version) this version refuses;"
        " `detail` says why; an admin PUTs new settings",
    ),
    (
        "stored-settings-refused",
        "409: a write to a collection whose stored settings (a `ttl`, `max_bytes`, `cache_control`… out of range,"
        " written by hand or by an earlier version) this version refuses; `detail` says why; an admin PUTs new ones",
    ),
    ("invalid-settings", "422: collection settings with an unknown member or a value out of range"),
    ("internal", "500: a bug; the server failed to handle the request"),
    ("rate-limited", "429: over the token's rate"),
    ("redis-error", "502: Redis answered with an error"),
    ("redis-unavailable", "503: Redis cannot be reached; retry after `Retry-After` seconds"),
    ("redis-not-ready", "503: Redis is a replica, loading, busy with a script or its cluster is in flux; retry"),
    ("redis-out-of-memory", "507: Redis is at maxmemory and refuses writes"),
    (
        "not-replicated",
        "503: a write applied on the primary but not confirmed by `JETWAY_WRITE_REPLICAS` replicas in time;"
        " `ETag` is the new one",
    ),
    ("not-ready", "503 (`/readyz` only): Redis does not answer"),
    ("redis-timeout", "504: Redis did not answer in time"),
    # Refused by the connection before any handler runs; the connection closes.
    ("malformed-request", "400: the request head breaks HTTP/1.1 framing (e.g. Content-Length with chunked)"),
    ("request-timeout", "408: the request head or body did not arrive in time"),
    ("request-line-too-long", "414: the request line is longer than 8 KiB"),
    ("headers-too-large", "431: more than 100 header lines or 64 KiB of them"),
    ("unsupported-transfer-coding", "501: a transfer coding other than chunked"),
    ("unsupported-http-version", "505: not HTTP/1.0 or HTTP/1.1"),
    ("server-busy", "503: the worker holds its budget of request bodies; retry after `Retry-After` seconds"),
    ("invalid-position", "400: `since` or `Last-Event-ID` is not a position of this collection's feed"),
    ("invalid-wait", "400: `wait` is not a whole number of seconds in range, or is given twice"),
    ("invalid-include_docs", "400: `include_docs` is not `true` or `false`, or is given twice"),
    ("invalid-ticket", "400: `ticket` is given twice"),
    ("feed-off", "404: the change feed is turned off on this server (`JETWAY_FEED=off`)"),
    (
        "feed-position-lost",
        "410: events after the position are no longer kept (the feed's cap, or a failover lost them):"
        " re-list the collection, then follow from a new position",
    ),
)

ERRORS: Dict[int, str] = {
    400: "The request is malformed; `type` and `detail` say how.",
    401: "No valid bearer token: missing, malformed, unknown, revoked or expired (never said which).",
    403: "The token lacks the scope: `read:<coll>`/`read:*` to read, `write:<coll>`/`write:*` to write, or `admin`.",
    429: "Over the token's rate; retry after `Retry-After` seconds. Every response to a token with a rate "
    "carries `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`.",
    404: "No such document.",
    405: "The path does not support this method; `Allow` lists those it does.",
    406: "`Accept-Encoding` refuses the stored bytes (`identity;q=0`) and every compressed variant stored.",
    408: "The request head or body did not arrive in time (`request-timeout`); the connection closes.",
    410: "The change feed no longer keeps the events after the position (`feed-position-lost`).",
    409: "The merge patch lost the race to concurrent writers too many times; retry.",
    412: "An `If-Match`, `If-None-Match` or `If-Unmodified-Since` condition does not hold.",
    413: "The body is larger than `JETWAY_MAX_BODY` bytes (default 1 MiB), or than the collection's `max_bytes`.",
    414: "The request line is longer than 8 KiB (`request-line-too-long`); the connection closes.",
    415: "The body is not labelled `application/json` (a `charset=utf-8` parameter is allowed).",
    431: "More than 100 header lines or 64 KiB of them (`headers-too-large`); the connection closes.",
    422: "The document breaks its collection's JSON Schema (`schema-violation`, with `errors`),"
    " or the merged document cannot be serialized as JSON.",
    500: "A bug: the server failed to handle the request.",
    502: "Redis answered with an error.",
    503: "Redis cannot be reached, or is failing over, loading or busy (`redis-not-ready`);"
    " or the worker is receiving too many request bodies (`server-busy`): retry after `Retry-After` seconds.",
    504: "Redis did not answer in time.",
    501: "A transfer coding other than chunked (`unsupported-transfer-coding`); the connection closes.",
    505: "Not HTTP/1.0 or HTTP/1.1 (`unsupported-http-version`); the connection closes.",
    507: "Redis is out of memory and refuses writes: free space before writing again.",
}
ERROR_HEADERS: Dict[int, Tuple[str, ...]] = {
    401: ("WWW-Authenticate",),
    405: ("Allow",),
    429: ("Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"),
    503: ("Retry-After",),
}
# What every /v1 operation may answer besides its own statuses: authorization,
# a bug, and Redis trouble.
REDIS = (401, 403, 429, 500, 502, 503, 504)
# What the connection answers, for any path, before a handler sees the request.
FRONT_DOOR = (400, 408, 414, 431, 501, 505)
MALFORMED = "The request head breaks HTTP/1.1 framing (`malformed-request`); the connection closes."
NOT_REPLICATED = (
    " On a write, also `not-replicated`: the primary applied it, but fewer than `JETWAY_WRITE_REPLICAS`"
    " replicas confirmed it within `JETWAY_WRITE_TIMEOUT` seconds, so a failover before they have it loses it."
    " Check with GET, or retry with `If-Match` and the `ETag` sent (on a create, at `Location`)."
)
RESPONSE_TOO_LARGE = (
    "the documents asked for (each counted as often as asked) add up to more than `JETWAY_MAX_RESPONSE_BYTES`"
    " (default 16 MiB; `response-too-large`, with `size` and `limit`): nothing was read. A page is never refused"
    " for its size: it ends early, with its `next` cursor."
)
FEED_OFF = "The change feed is turned off on this server (`feed-off`)."
LOST = (
    "Events after `since` / `Last-Event-ID` are no longer kept (`feed-position-lost`): the feed's cap"
    " (`JETWAY_FEED_MAX_EVENTS`, `JETWAY_FEED_MAX_AGE`) dropped them, or a failover lost them with their"
    " writes. Open the feed from now (no `since`: its `next` or `ready` position), re-list the collection,"
    " then apply the feed's events from that position."
)
KEY_IN_USE = (
    "A request with this `Idempotency-Key` is still being carried out (`idempotency-key-in-use`);"
    " retry after `Retry-After` seconds."
)
STORED_REFUSED = (
    "The collection's stored settings or schema, stored by an earlier version, are refused by this one"
    " (`stored-settings-refused`, `stored-schema-refused`): an admin replaces or deletes them."
)
KEY_REUSED = "This `Idempotency-Key` was used for a different request (`idempotency-key-reused`)."
STREAM = (
    "With `Accept: text/event-stream`: Server-Sent Events, chunked, until the server ends them. First"
    f' `retry: {RETRY_MS}`, `id:` (the starting position) and `event: ready` with `{{"position": ...}}`;'
    " then each change as `id:` (the position after it, what `Last-Event-ID` resumes from) and `data:`"
    " (a `ChangeEvent`); a comment line every"
    f" {HEARTBEAT_SECONDS:g} s. Named events that end the stream: `fell-behind` (the client did not read its"
    " buffer in time: reconnect), `lost` (as the 410), `reconnect` (the server is shutting down, or could not"
    " read the feed: reconnect). Otherwise a long poll: a `ChangesPage`."
)
