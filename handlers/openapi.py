"""``/openapi.json``: the OpenAPI 3.1 description of the API.

The document is assembled from small builders rather than written out as one
literal, and its limits and patterns are imported from ``handlers.http.validation``
so that the description cannot drift from the checks. ``tests/test_openapi.py``
holds it to the route table of ``api/app.py`` and to the OpenAPI 3.1 schema.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, List, Optional, Pattern, Tuple

from twisted.internet import defer

from handlers import docs
from handlers.base import JSON_TYPE, PROBLEM_TYPE, RETRY_AFTER_SECONDS, JsonHandler
from handlers.http import validation
from handlers.http.errors import PROBLEM_TYPE_PREFIX
from handlers.metrics import METRICS_TYPE

Json = Dict[str, Any]

# Path templates of the routes in api/app.py (which matches segments loosely).
HEALTHZ = "/healthz"
READYZ = "/readyz"
OPENAPI = "/openapi.json"
METRICS = "/metrics"
DOCUMENT = "/v1/{collection}/{id}"
COLLECTION = "/v1/{collection}"
MULTI_GET = "/v1/_get/{collection}"
DOCS = docs.PAGE_PATH
DOCS_ASSET = docs.ASSETS_PATH + "{asset}"

# Every problem type the handlers raise, and when.
PROBLEM_TYPES: Tuple[Tuple[str, str], ...] = (
    ("invalid-collection", "400: the collection name does not match its pattern"),
    ("invalid-id", "400: a document id (in the path or in `ids`) does not match its pattern"),
    ("invalid-ttl", "400: `ttl` is not a whole number in range, or is given twice"),
    ("invalid-limit", "400: `limit` is not a whole number in range, or is given twice"),
    ("invalid-cursor", "400: `cursor` is not one this API made, or is given twice"),
    ("invalid-ids", "400: too many `ids`, `ids` with `cursor`, or with a `limit` less than their number"),
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
)

_ERRORS: Dict[int, str] = {
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
_ERROR_HEADERS: Dict[int, Tuple[str, ...]] = {
    401: ("WWW-Authenticate",),
    405: ("Allow",),
    429: ("Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"),
    503: ("Retry-After",),
}
# What every /v1 operation may answer besides its own statuses: authorization,
# a bug, and Redis trouble.
_REDIS = (401, 403, 429, 500, 502, 503, 504)
# What the connection answers, for any path, before a handler sees the request.
_FRONT_DOOR = (400, 408, 414, 431, 501, 505)
_MALFORMED = "The request head breaks HTTP/1.1 framing (`malformed-request`); the connection closes."
_KEY_IN_USE = (
    "A request with this `Idempotency-Key` is still being carried out (`idempotency-key-in-use`);"
    " retry after `Retry-After` seconds."
)
_STORED_REFUSED = (
    "The collection's stored settings or schema, stored by an earlier version, are refused by this one"
    " (`stored-settings-refused`, `stored-schema-refused`): an admin replaces or deletes them."
)
_KEY_REUSED = "This `Idempotency-Key` was used for a different request (`idempotency-key-reused`)."


def _ref(kind: str, name: str) -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def _anchored(regex: Pattern[str]) -> str:
    """A ``re`` pattern ending in ``\\Z`` as an anchored ECMA-262 pattern."""
    if not regex.pattern.endswith(r"\Z"):
        raise ValueError(f"{regex.pattern!r} is not anchored with \\Z")
    return "^" + regex.pattern[: -len(r"\Z")] + "$"


def _object(properties: Json, required: Iterable[str], description: str) -> Json:
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _response(
    description: str, schema: Optional[Json] = None, headers: Iterable[str] = (), media: str = JSON_TYPE
) -> Json:
    response: Json = {"description": description}
    if headers:
        response["headers"] = {name: _ref("headers", name) for name in headers}
    if schema is not None:
        response["content"] = {media: {"schema": schema}}
    return response


def _errors(statuses: Iterable[int], **details: str) -> Dict[str, Json]:
    """Problem responses; ``details`` (``e415="..."``) overrides a default description."""
    return {
        str(status): _response(
            details.get(f"e{status}", _ERRORS[status]),
            _ref("schemas", "Problem"),
            _ERROR_HEADERS.get(status, ()),
            PROBLEM_TYPE,
        )
        for status in sorted(statuses)
    }


_NOT_REPLICATED = (
    " On a write, also `not-replicated`: the primary applied it, but fewer than `JETWAY_WRITE_REPLICAS`"
    " replicas confirmed it within `JETWAY_WRITE_TIMEOUT` seconds, so a failover before they have it loses it."
    " Check with GET, or retry with `If-Match` and the `ETag` sent (on a create, at `Location`)."
)


_RESPONSE_TOO_LARGE = (
    "the documents asked for (each counted as often as asked) add up to more than `JETWAY_MAX_RESPONSE_BYTES`"
    " (default 16 MiB; `response-too-large`, with `size` and `limit`): nothing was read. A page is never refused"
    " for its size: it ends early, with its `next` cursor."
)


def _write_errors(statuses: Iterable[int], *headers_503: str, **details: str) -> Dict[str, Json]:
    """``_errors`` of a write: its 503 may also be `not-replicated`, with the headers to check it by."""
    errors = _errors(statuses, **details)
    errors["503"] = _response(
        _ERRORS[503] + _NOT_REPLICATED, _ref("schemas", "Problem"), ("Retry-After", *headers_503), PROBLEM_TYPE
    )
    return errors


def _stored(description: str) -> Json:
    return _response(description, _ref("schemas", "Document"), ("ETag", "Last-Modified"))


def _operation(operation_id: str, summary: str, tag: str, responses: Json, **extra: Any) -> Json:
    return {"operationId": operation_id, "summary": summary, "tags": [tag], **extra, "responses": responses}


def _head_of(get: Json, operation_id: str) -> Json:
    """HEAD: the GET operation, answering the same headers with no body."""
    head = copy.deepcopy(get)
    head["operationId"] = operation_id
    head["summary"] = "Same as GET, headers only: " + get["summary"][0].lower() + get["summary"][1:]
    for response in head["responses"].values():
        response.pop("content", None)
    return head


def _body(media: str, description: str, schema: str) -> Json:
    return {"required": True, "description": description, "content": {media: {"schema": _ref("schemas", schema)}}}


def _secured(operations: Json) -> Json:
    """/v1 operations need a bearer token (deny by default)."""
    return {method: {**operation, "security": [{"bearer": []}]} for method, operation in operations.items()}


def _path_item(description: str, name: str, operations: Json, parameters: Iterable[str] = ()) -> Json:
    """A path: its operations, an OPTIONS (``options<name>``), and the connection's own statuses on each."""
    item: Json = {"description": description + " Any other method is a 405 with `Allow` (see MethodNotAllowed)."}
    if parameters:
        item["parameters"] = _parameters_named(*parameters)
    operations = {**operations, "options": _options(name, [method.upper() for method in operations])}
    front_door = _front_door_responses()
    for method, operation in operations.items():
        for status, response in front_door.items():
            if method == "head":
                response = {key: value for key, value in response.items() if key != "content"}
            operation["responses"].setdefault(str(status), response)
    return {**item, **operations}


def _front_door_responses() -> Dict[int, Json]:
    return {status: _errors((status,), e400=_MALFORMED)[str(status)] for status in _FRONT_DOOR}


def _options(name: str, methods: List[str]) -> Json:
    allowed = ", ".join([*methods, "OPTIONS"])
    return _operation(
        f"options{name}",
        "What the path supports; answers a browser's CORS preflight",
        "meta",
        {
            "204": _response(
                f"`Allow: {allowed}`. A preflight (`Access-Control-Request-Method`) from an origin in"
                " `JETWAY_CORS_ORIGINS` also gets `Access-Control-Allow-Origin`, `-Allow-Methods`, `-Allow-Headers`"
                " and `-Max-Age`; it needs no token.",
                headers=("Allow",),
            )
        },
    )


def _with_head(get: Json, head_id: str) -> Json:
    return {"get": get, "head": _head_of(get, head_id)}


def _health_paths() -> Json:
    ok = _object({"status": {"const": "ok"}}, ["status"], "The process is up.")
    ready = _object({"status": {"const": "ready"}}, ["status"], "Redis answers.")
    not_ready = _errors((503,), e503="Redis does not answer in time (problem type `not-ready`).")
    spec = {"type": "object", "additionalProperties": True, "description": "This document."}
    return {
        HEALTHZ: _path_item(
            "Liveness: answers without touching Redis.",
            "Health",
            _with_head(_operation("getHealth", "Liveness", "health", {"200": _response("Up.", ok)}), "headHealth"),
        ),
        READYZ: _path_item(
            "Readiness: answers once Redis answers a PING, within at most a second.",
            "Readiness",
            _with_head(
                _operation("getReadiness", "Readiness", "health", {"200": _response("Ready.", ready), **not_ready}),
                "headReadiness",
            ),
        ),
        METRICS: _path_item(
            "Prometheus metrics, aggregated over every worker of this instance.",
            "Metrics",
            _with_head(
                _operation(
                    "getMetrics",
                    "Metrics",
                    "meta",
                    {"200": _response("Prometheus text format 0.0.4.", {"type": "string"}, media=METRICS_TYPE)},
                ),
                "headMetrics",
            ),
        ),
        OPENAPI: _path_item(
            "The OpenAPI 3.1 description of the API.",
            "OpenApi",
            _with_head(
                _operation("getOpenApi", "This document", "meta", {"200": _response("OK.", spec)}), "headOpenApi"
            ),
        ),
    }


def _docs_paths() -> Json:
    """``/docs`` and its assets: no token, cached by ``ETag`` and ``Cache-Control``."""
    cached = ("ETag", "Cache-Control")
    not_modified = _response("`If-None-Match` matches the current ETag.", headers=cached)
    page = _operation(
        "getDocs",
        "Swagger UI over this document",
        "meta",
        {
            "200": _response("The page.", {"type": "string"}, ("Content-Security-Policy", *cached), docs.HTML_TYPE),
            "304": not_modified,
        },
        parameters=_parameters_named("If-None-Match"),
    )
    asset = _operation(
        "getDocsAsset",
        "A script or style of the /docs page",
        "meta",
        {
            "200": {
                **_response("The file; `Cache-Control` says a year when `v` is its current version.", headers=cached),
                "content": {media: {"schema": {"type": "string"}} for media in docs.ASSET_TYPES},
            },
            "304": not_modified,
            **_errors((404,), e404="No such asset (problem type `no-route`)."),
        },
        parameters=[
            _parameter("asset", "path", "The file.", {"type": "string", "enum": list(docs.ASSET_NAMES)}, required=True),
            _parameter("v", "query", "The asset's version, as the page names it.", {"type": "string"}),
            *_parameters_named("If-None-Match"),
        ],
    )
    return {
        DOCS: _path_item("Swagger UI (off with `JETWAY_DOCS=off`).", "Docs", _with_head(page, "headDocs")),
        DOCS_ASSET: _path_item(
            "The page's assets, from a packaged Swagger UI.",
            "DocsAsset",
            _with_head(asset, "headDocsAsset"),
            ("asset",),
        ),
    }


def _document_operations() -> Json:
    get = _operation(
        "getDocument",
        "Read a document: the stored bytes, verbatim, or a compressed variant stored with them",
        "documents",
        {
            "200": _response(
                "The document, exactly as it was stored; or, when `Accept-Encoding` prefers one that is stored"
                " (documents of at least `JETWAY_COMPRESS_MIN_BYTES`), its compressed variant with"
                " `Content-Encoding` and an ETag of its own. `Vary: Accept-Encoding` when variants are stored.",
                _ref("schemas", "Document"),
                ("ETag", "Last-Modified", "Cache-Control", "Vary", "Content-Encoding"),
            ),
            "304": _response(
                "`If-None-Match` names the document (any variant's ETag does), or, without `If-None-Match`,"
                " it was not modified since `If-Modified-Since`.",
                headers=("ETag", "Cache-Control", "Vary"),
            ),
            **_errors((400, 404, 406, *_REDIS), e400="Invalid collection name or document id."),
        },
        parameters=_parameters_named("If-None-Match", "If-Modified-Since", "Accept-Encoding"),
    )
    put = _operation(
        "putDocument",
        "Create or replace a document",
        "documents",
        {
            "200": _stored("Replaced; the body is the document as stored."),
            "201": _stored("Created; the body is the document as stored."),
            **_write_errors(
                (400, 409, 412, 413, 415, 422, 507, *_REDIS),
                "ETag",
                e400="Invalid collection name, document id or `ttl`; malformed JSON; or not an object.",
                e409=_STORED_REFUSED,
                e412="`If-Match` does not match, or `If-None-Match` matches (`*`: the document exists).",
            ),
        },
        parameters=_parameters_named("If-Match", "If-None-Match", "If-Unmodified-Since", "ttl"),
        requestBody=_body(JSON_TYPE, "The document, stored verbatim once validated.", "Document"),
    )
    patch = _operation(
        "patchDocument",
        "Merge-patch a document (RFC 7396), atomically against concurrent writers",
        "documents",
        {
            "200": _response(
                "Patched; the body is the compact serialization of the merged document (with an"
                " `Idempotency-Key`, perhaps the first attempt's answer again, marked `Idempotency-Replayed`).",
                _ref("schemas", "Document"),
                ("ETag", "Last-Modified", "Idempotency-Replayed"),
            ),
            **_write_errors(
                (400, 404, 409, 412, 413, 415, 422, 507, *_REDIS),
                "ETag",
                e400="Invalid collection name or document id; malformed JSON; or the patch is not an object.",
                e412="`If-Match` does not match the current ETag.",
                e413="The patch, or the merged document, is larger than `JETWAY_MAX_BODY` bytes (default 1 MiB).",
                e415="The body is not labelled `application/merge-patch+json` (`charset=utf-8` allowed).",
                e409="The merge patch lost the race to concurrent writers too many times; retry. Or: "
                + _KEY_IN_USE
                + " Or: "
                + _STORED_REFUSED,
                e422="The merged document breaks its collection's JSON Schema (`schema-violation`, with `errors`),"
                " or cannot be serialized as JSON (e.g. a number beyond the range of a double; `unrepresentable`)."
                " Or: " + _KEY_REUSED,
            ),
        },
        parameters=_parameters_named("If-Match", "If-Unmodified-Since", "Idempotency-Key"),
        requestBody=_body(validation.MERGE_PATCH_JSON, "A JSON Merge Patch: `null` removes a member.", "MergePatch"),
    )
    delete = _operation(
        "deleteDocument",
        "Delete a document",
        "documents",
        {
            "204": _response("Deleted."),
            **_write_errors((400, 404, 412, *_REDIS), e400="Invalid collection name or document id."),
        },
        parameters=_parameters_named("If-Match", "If-Unmodified-Since"),
    )
    return {**_with_head(get, "headDocument"), "put": put, "patch": patch, "delete": delete}


def _collection_operations() -> Json:
    listing = {"oneOf": [_ref("schemas", "Page"), _ref("schemas", "Items")]}
    get = _operation(
        "listDocuments",
        "A page of documents in id order (`limit`, `cursor`), or many documents by id (`ids`)",
        "collections",
        {
            "200": _response(
                "A `Page` without `ids`, `Items` with `ids`; gzipped as it is sent when `Accept-Encoding` prefers"
                " gzip and it is at least `JETWAY_COMPRESS_MIN_BYTES`. A weak `ETag` names its content.",
                listing,
                ("ETag", "Cache-Control", "Vary", "Content-Encoding"),
            ),
            "304": _response(
                "`If-None-Match` names the page's weak ETag: its content has not changed.",
                headers=("ETag", "Cache-Control", "Vary"),
            ),
            **_errors(
                (400, 406, 413, *_REDIS),
                e400="Invalid collection name, `limit`, `cursor` or `ids`; `ids` with `cursor`, or with a `limit`"
                " less than their number.",
                e413=_RESPONSE_TOO_LARGE,
            ),
        },
        parameters=_parameters_named("limit", "cursor", "ids", "If-None-Match", "Accept-Encoding"),
    )
    post = _operation(
        "createDocument",
        "Create a document under a new, sortable id (a ULID)",
        "collections",
        {
            "201": _response(
                "Created; the body is the document as stored (with an `Idempotency-Key`, perhaps the first"
                " attempt's answer again, marked `Idempotency-Replayed`).",
                _ref("schemas", "Document"),
                ("Location", "ETag", "Last-Modified", "Idempotency-Replayed"),
            ),
            **_write_errors(
                (400, 409, 413, 415, 422, 507, *_REDIS),
                "ETag",
                "Location",
                e400="Invalid collection name, `ttl` or `Idempotency-Key`; malformed JSON; or not an object.",
                e409=_KEY_IN_USE + " Or: " + _STORED_REFUSED,
                e422="The document breaks its collection's JSON Schema (`schema-violation`, with `errors`). Or: "
                + _KEY_REUSED,
            ),
        },
        parameters=_parameters_named("ttl", "Idempotency-Key"),
        requestBody=_body(JSON_TYPE, "The document, stored verbatim once validated.", "Document"),
    )
    return {**_with_head(get, "headCollection"), "post": post}


def _multi_get_operations() -> Json:
    post = _operation(
        "getDocuments",
        "Many documents by id, the ids in the body: any list the GET form's request line cannot hold",
        "collections",
        {
            "200": _response(
                "The documents in the order asked, null where missing; gzipped as they are sent when"
                " `Accept-Encoding` prefers gzip and they are at least `JETWAY_COMPRESS_MIN_BYTES`.",
                _ref("schemas", "Items"),
                ("Cache-Control", "Vary", "Content-Encoding"),
            ),
            **_errors(
                (400, 406, 413, 415, *_REDIS),
                e400='Invalid collection name or id (named), too many ids, malformed JSON, or not `{"ids": [...]}`.',
                e413="The body is larger than `JETWAY_MAX_BODY`; or " + _RESPONSE_TOO_LARGE,
            ),
        },
        parameters=_parameters_named("Accept-Encoding"),
        requestBody=_body(JSON_TYPE, "The ids to fetch; duplicates are answered in place.", "IdList"),
    )
    return {"post": post}


def _parameters_named(*names: str) -> List[Json]:
    return [_ref("parameters", name) for name in names]


def _parameter(name: str, where: str, description: str, schema: Json, **extra: Any) -> Json:
    return {"name": name, "in": where, "description": description, "schema": schema, **extra}


def _parameters(max_ids: int) -> Json:
    def integer(low: int, high: int, **extra: Any) -> Json:
        return {"type": "integer", "minimum": low, "maximum": high, **extra}

    tags = {"type": "string"}
    return {
        "collection": _parameter(
            "collection", "path", "A collection name.", _ref("schemas", "CollectionName"), required=True
        ),
        "id": _parameter("id", "path", "A document id.", _ref("schemas", "DocumentId"), required=True),
        "asset": _parameter(
            "asset",
            "path",
            "A file of the /docs page.",
            _ref("schemas", "DocsAsset"),
            required=True,
        ),
        "ttl": _parameter(
            "ttl",
            "query",
            "Seconds until the document expires. Without it the document never expires "
            "(a PUT removes any earlier expiry).",
            integer(1, validation.MAX_TTL),
        ),
        # No `default` in the schema: generated clients would send it with every
        # request, `ids` or not; the description says what absence means.
        "limit": _parameter(
            "limit",
            "query",
            f"Page size; {validation.DEFAULT_LIMIT} when absent. Beside `ids` it is ignored, unless it is less than"
            " the number of ids (a 400: a multi-get answers every id).",
            integer(1, validation.MAX_LIMIT),
        ),
        "cursor": _parameter(
            "cursor", "query", "Where to continue: the `next` of the previous page.", {"type": "string"}
        ),
        "ids": _parameter(
            "ids",
            "query",
            "Document ids to fetch in one round trip, comma-separated (`ids=a,b`), repeated (`ids=a&ids=b`) or"
            f" both, up to {max_ids} in all; not with `cursor`. The request line (8 KiB, and often less through"
            " proxies) bounds how many fit: about 60 ids of 128 characters, 700 of 10;"
            f" `POST {MULTI_GET}` takes up to {max_ids} in a body.",
            {"type": "array", "items": _ref("schemas", "DocumentId"), "minItems": 1, "maxItems": max_ids},
            style="form",
            explode=False,
        ),
        "If-Match": _parameter(
            "If-Match", "header", "`*` or strong entity tags: act only if one matches (a weak tag never does).", tags
        ),
        "Idempotency-Key": _parameter(
            "Idempotency-Key",
            "header",
            "A key of the client's making (draft-ietf-httpapi-idempotency-key-header), 1 to 255 printable ASCII"
            " characters, quoted or not: a retry with the same key and request gets the first response again,"
            " and nothing is written twice, also after a crash. Kept 24 hours per token.",
            {"type": "string", "maxLength": 257},
        ),
        "If-Modified-Since": _parameter(
            "If-Modified-Since",
            "header",
            "An HTTP-date: 304 if the document was not written after it. Ignored with `If-None-Match`.",
            {"type": "string"},
        ),
        "If-Unmodified-Since": _parameter(
            "If-Unmodified-Since",
            "header",
            "An HTTP-date: 412 if the document was written after it. Ignored with `If-Match` or when the"
            " document does not exist.",
            {"type": "string"},
        ),
        "Accept-Encoding": _parameter(
            "Accept-Encoding",
            "header",
            "Content codings the client decodes, with q-values (RFC 9110 12.5.3). Documents of at least"
            " `JETWAY_COMPRESS_MIN_BYTES` are stored with a `gzip` variant, sent as stored, and list pages and"
            " multi-gets that large are gzipped as they are sent; without this header the stored bytes are sent;"
            " `identity;q=0` with nothing else available accepted is a 406.",
            {"type": "string"},
        ),
        "Prefer": _parameter(
            "Prefer",
            "header",
            "`return=minimal`: a batch's write results carry no `document` (RFC 7240).",
            {"type": "string"},
        ),
        "If-None-Match": _parameter(
            "If-None-Match",
            "header",
            "`*` or entity tags, compared weakly. GET/HEAD: 304 if one matches. PUT: 412 if one matches "
            "(`*`: create only).",
            tags,
        ),
    }


def _headers() -> Json:
    def header(description: str, required: bool = True, **schema: Any) -> Json:
        # `required`: on every response that lists the header (tests/test_openapi.py checks real responses).
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
            " compression is on); `Origin` beside it when `JETWAY_CORS_ORIGINS` lists origins.",
            required=False,
        ),
        "Content-Encoding": header("`gzip` when the body is sent compressed.", required=False),
        "Idempotency-Replayed": header(
            "`true` when the response is the stored answer to an earlier request with the same `Idempotency-Key`.",
            required=False,
        ),
        "Last-Modified": header("When the document was last written (HTTP date)."),
        "Location": header("The path of the new document.", examples=["/v1/orders/01J0000000000000000000000"]),
        "Retry-After": header("Seconds to wait before retrying.", pattern="^[0-9]+$", examples=[RETRY_AFTER_SECONDS]),
        "Allow": header("The methods the path supports.", examples=["GET, HEAD, POST"]),
        "WWW-Authenticate": header("The scheme to authenticate with.", examples=['Bearer realm="jetway"']),
        "RateLimit-Limit": header("Requests the token may make per period (its burst).", pattern="^[0-9]+$"),
        "RateLimit-Remaining": header("Requests left right now.", pattern="^[0-9]+$"),
        "RateLimit-Reset": header("Seconds until the full allowance is back.", pattern="^[0-9]+$"),
        "Content-Security-Policy": header("What the page may load: only from this origin."),
    }


def _problem_schema(more: Iterable[Tuple[str, str]] = ()) -> Json:
    listed = "\n".join(f"- `{PROBLEM_TYPE_PREFIX}{slug}`: {meaning}" for slug, meaning in (*PROBLEM_TYPES, *more))
    return _object(
        {
            "type": {"type": "string", "format": "uri", "description": "One of:\n" + listed},
            "title": {"type": "string", "description": "The reason phrase of `status`."},
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": {"type": "string", "description": "What went wrong with this request."},
            "errors": {
                "type": "array",
                "maxItems": 20,
                "description": "`schema-violation` only: each way the document breaks its collection's schema"
                " (the first 20).",
                "items": _object(
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


def _schemas(max_ids: int) -> Json:
    # additionalProperties spelled out: JSON Schema's default, but generators
    # read its absence as "no members" (openapi-typescript: Record<string, never>).
    document = {
        "type": "object",
        "additionalProperties": True,
        "description": "A JSON object; stored and returned as the exact bytes written.",
    }
    nullable_document = {"oneOf": [_ref("schemas", "Document"), {"type": "null"}]}
    return {
        "CollectionName": {"type": "string", "pattern": _anchored(validation.COLLECTION_PATTERN)},
        "DocumentId": {
            "type": "string",
            "pattern": _anchored(validation.ID_PATTERN),
            "not": {"enum": [".", ".."]},
        },
        "Document": document,
        "DocsAsset": {"type": "string", "enum": list(docs.ASSET_NAMES), "description": "A file of the /docs page."},
        "IdList": _object(
            {"ids": {"type": "array", "items": _ref("schemas", "DocumentId"), "maxItems": max_ids}},
            ["ids"],
            "Document ids to fetch in one round trip.",
        ),
        "MergePatch": {
            "type": "object",
            "additionalProperties": True,
            "description": "An RFC 7396 merge patch; it must be an object here.",
        },
        "Page": _object(
            {
                "items": {"type": "array", "items": _ref("schemas", "Document")},
                "next": {"type": ["string", "null"], "description": "The `cursor` of the next page; null on the last."},
            },
            ["items", "next"],
            "A page of documents in id order.",
        ),
        "Items": _object(
            {"items": {"type": "array", "items": nullable_document, "description": "In `ids` order; null if missing."}},
            ["items"],
            "Documents by id.",
        ),
        "Problem": _problem_schema(),
    }


def openapi_document(max_ids: int = validation.MAX_IDS, with_docs: bool = True, max_wait: int = 60) -> Json:
    """The whole OpenAPI 3.1.0 document, as plain JSON values."""
    # Imported here: handlers.openapi_batch and the change feed's part
    # (handlers.openapi_changes) are built from this module's builders.
    from handlers import openapi_changes as changes
    from handlers.openapi_batch import BATCH, batch_operations, batch_schemas

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Jetway",
            "version": "1",
            "description": "A JSON REST gateway to Redis. Errors are `application/problem+json` "
            "(see the Problem schema); an unknown path is a 404 (`no-route`).",
        },
        "paths": {
            **_health_paths(),
            **(_docs_paths() if with_docs else {}),
            DOCUMENT: _path_item("One document.", "Document", _secured(_document_operations()), ("collection", "id")),
            COLLECTION: _path_item(
                "A collection (a trailing slash is accepted).",
                "Collection",
                _secured(_collection_operations()),
                ("collection",),
            ),
            MULTI_GET: _path_item(
                "A multi-get by POST.", "MultiGet", _secured(_multi_get_operations()), ("collection",)
            ),
            BATCH: _path_item("Many operations in one request.", "Batch", _secured(batch_operations())),
            **changes.changes_paths(max_wait),
        },
        "components": {
            "schemas": {
                **_schemas(max_ids),
                **batch_schemas(),
                **changes.changes_schemas(),
                "Problem": _problem_schema(changes.PROBLEM_TYPES),
            },
            "parameters": {**_parameters(max_ids), **changes.changes_parameters(max_wait)},
            "headers": _headers(),
            "responses": {"MethodNotAllowed": _errors((405,))["405"]},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token made with `python -m api keys create`; only its SHA-256 is stored.",
                },
                "ticket": changes.TICKET_SCHEME,
            },
        },
    }


class OpenApiHandler(JsonHandler):
    ROUTE = "openapi"

    def initialize(self, source: Any) -> None:
        # handlers.openapi_collections.OpenApiSource: serialized once, again only after a settings change.
        self.source = source

    def get(self) -> defer.Deferred:
        return self.source.body().addCallback(self._send)

    def _send(self, body: bytes) -> None:
        self.send_bytes(200, body)

    head = get
