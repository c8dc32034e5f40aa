"""``/openapi.json``: the OpenAPI 3.1 description of the API.

The document is assembled from small builders rather than written out as one
literal, and its limits and patterns are imported from ``handlers.validation``
so that the description cannot drift from the checks. ``tests/test_openapi.py``
holds it to the route table of ``api/app.py`` and to the OpenAPI 3.1 schema.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterable, List, Optional, Pattern, Tuple

from twisted.internet import defer

from handlers import validation
from handlers.base import JSON_TYPE, PROBLEM_TYPE, RETRY_AFTER_SECONDS, JsonHandler
from handlers.errors import PROBLEM_TYPE_PREFIX
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
    ("precondition-failed", "412: an `If-Match` / `If-None-Match` condition does not hold"),
    ("body-too-large", "413: the body, or the merged document, is larger than the limit"),
    ("unsupported-media-type", "415: the body is not labelled with the media type the operation takes"),
    ("unrepresentable", "422: the merged document cannot be serialized as JSON (e.g. a number out of range)"),
    (
        "schema-violation",
        "422: the document (on PATCH, the merged document) breaks its collection's JSON Schema; `errors` lists where",
    ),
    ("invalid-schema", "422: collection settings whose `schema` is not a valid Draft 2020-12 JSON Schema"),
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
    409: "The merge patch lost the race to concurrent writers too many times; retry.",
    412: "An `If-Match` or `If-None-Match` condition does not hold.",
    413: "The body is larger than `JETWAY_MAX_BODY` bytes (default 1 MiB), or than the collection's `max_bytes`.",
    415: "The body is not labelled `application/json` (a `charset=utf-8` parameter is allowed).",
    422: "The document breaks its collection's JSON Schema (`schema-violation`, with `errors`).",
    500: "A bug: the server failed to handle the request.",
    502: "Redis answered with an error.",
    503: "Redis cannot be reached, or is failing over, loading or busy (`redis-not-ready`);"
    " or the worker is receiving too many request bodies (`server-busy`): retry after `Retry-After` seconds.",
    504: "Redis did not answer in time.",
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


def _path_item(description: str, operations: Json, parameters: Iterable[str] = ()) -> Json:
    item: Json = {"description": description + " Any other method is a 405 with `Allow` (see MethodNotAllowed)."}
    if parameters:
        item["parameters"] = _parameters_named(*parameters)
    return {**item, **operations}


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
            _with_head(_operation("getHealth", "Liveness", "health", {"200": _response("Up.", ok)}), "headHealth"),
        ),
        READYZ: _path_item(
            "Readiness: answers once Redis answers a PING, within at most a second.",
            _with_head(
                _operation("getReadiness", "Readiness", "health", {"200": _response("Ready.", ready), **not_ready}),
                "headReadiness",
            ),
        ),
        METRICS: _path_item(
            "Prometheus metrics, aggregated over every worker of this instance.",
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
            _with_head(
                _operation("getOpenApi", "This document", "meta", {"200": _response("OK.", spec)}), "headOpenApi"
            ),
        ),
    }


def _document_operations() -> Json:
    get = _operation(
        "getDocument",
        "Read a document: the stored bytes, verbatim",
        "documents",
        {
            "200": _stored("The document, exactly as it was stored."),
            "304": _response("`If-None-Match` matches the current ETag.", headers=("ETag",)),
            **_errors((400, 404, *_REDIS), e400="Invalid collection name or document id."),
        },
        parameters=_parameters_named("If-None-Match"),
    )
    put = _operation(
        "putDocument",
        "Create or replace a document",
        "documents",
        {
            "200": _stored("Replaced; the body is the document as stored."),
            "201": _stored("Created; the body is the document as stored."),
            **_write_errors(
                (400, 412, 413, 415, 422, 507, *_REDIS),
                "ETag",
                e400="Invalid collection name, document id or `ttl`; malformed JSON; or not an object.",
                e412="`If-Match` does not match, or `If-None-Match` matches (`*`: the document exists).",
            ),
        },
        parameters=_parameters_named("If-Match", "If-None-Match", "ttl"),
        requestBody=_body(JSON_TYPE, "The document, stored verbatim once validated.", "Document"),
    )
    patch = _operation(
        "patchDocument",
        "Merge-patch a document (RFC 7396), atomically against concurrent writers",
        "documents",
        {
            "200": _stored("Patched; the body is the compact serialization of the merged document."),
            **_write_errors(
                (400, 404, 409, 412, 413, 415, 422, 507, *_REDIS),
                "ETag",
                e400="Invalid collection name or document id; malformed JSON; or the patch is not an object.",
                e412="`If-Match` does not match the current ETag.",
                e413="The patch, or the merged document, is larger than `JETWAY_MAX_BODY` bytes (default 1 MiB).",
                e415="The body is not labelled `application/merge-patch+json` (`charset=utf-8` allowed).",
                e422="The merged document breaks its collection's JSON Schema (`schema-violation`, with `errors`),"
                " or cannot be serialized as JSON (e.g. a number beyond the range of a double; `unrepresentable`).",
            ),
        },
        parameters=_parameters_named("If-Match"),
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
        parameters=_parameters_named("If-Match"),
    )
    return {**_with_head(get, "headDocument"), "put": put, "patch": patch, "delete": delete}


def _collection_operations() -> Json:
    listing = {"oneOf": [_ref("schemas", "Page"), _ref("schemas", "Items")]}
    get = _operation(
        "listDocuments",
        "A page of documents in id order (`limit`, `cursor`), or many documents by id (`ids`)",
        "collections",
        {
            "200": _response("A `Page` without `ids`, `Items` with `ids`.", listing),
            **_errors(
                (400, *_REDIS),
                e400="Invalid collection name, `limit`, `cursor` or `ids`; `ids` with `cursor`, or with a `limit`"
                " less than their number.",
            ),
        },
        parameters=_parameters_named("limit", "cursor", "ids"),
    )
    post = _operation(
        "createDocument",
        "Create a document under a new, sortable id (a ULID)",
        "collections",
        {
            "201": _response(
                "Created; the body is the document as stored.",
                _ref("schemas", "Document"),
                ("Location", "ETag", "Last-Modified"),
            ),
            **_write_errors(
                (400, 413, 415, 422, 507, *_REDIS),
                "ETag",
                "Location",
                e400="Invalid collection name or `ttl`; malformed JSON; or not an object.",
            ),
        },
        parameters=_parameters_named("ttl"),
        requestBody=_body(JSON_TYPE, "The document, stored verbatim once validated.", "Document"),
    )
    return {**_with_head(get, "headCollection"), "post": post}


def _multi_get_operations() -> Json:
    post = _operation(
        "getDocuments",
        "Many documents by id, the ids in the body: any list the GET form's request line cannot hold",
        "collections",
        {
            "200": _response("The documents in the order asked, null where missing.", _ref("schemas", "Items")),
            **_errors(
                (400, 413, 415, *_REDIS),
                e400='Invalid collection name or id (named), too many ids, malformed JSON, or not `{"ids": [...]}`.',
            ),
        },
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
        "If-None-Match": _parameter(
            "If-None-Match",
            "header",
            "`*` or entity tags, compared weakly. GET/HEAD: 304 if one matches. PUT: 412 if one matches "
            "(`*`: create only).",
            tags,
        ),
    }


def _headers() -> Json:
    def header(description: str, **schema: Any) -> Json:
        return {"description": description, "schema": {"type": "string", **schema}}

    return {
        "ETag": header("The document's strong entity tag; it changes on every write."),
        "Last-Modified": header("When the document was last written (HTTP date)."),
        "Location": header("The path of the new document.", examples=["/v1/orders/01J0000000000000000000000"]),
        "Retry-After": header("Seconds to wait before retrying.", pattern="^[0-9]+$", examples=[RETRY_AFTER_SECONDS]),
        "Allow": header("The methods the path supports.", examples=["GET, HEAD, POST"]),
        "WWW-Authenticate": header("The scheme to authenticate with.", examples=['Bearer realm="jetway"']),
        "RateLimit-Limit": header("Requests the token may make per period (its burst).", pattern="^[0-9]+$"),
        "RateLimit-Remaining": header("Requests left right now.", pattern="^[0-9]+$"),
        "RateLimit-Reset": header("Seconds until the full allowance is back.", pattern="^[0-9]+$"),
    }


def _problem_schema() -> Json:
    listed = "\n".join(f"- `{PROBLEM_TYPE_PREFIX}{slug}`: {meaning}" for slug, meaning in PROBLEM_TYPES)
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


def openapi_document(max_ids: int = validation.MAX_IDS) -> Json:
    """The whole OpenAPI 3.1.0 document, as plain JSON values."""
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
            DOCUMENT: _path_item("One document.", _secured(_document_operations()), ("collection", "id")),
            COLLECTION: _path_item(
                "A collection (a trailing slash is accepted).", _secured(_collection_operations()), ("collection",)
            ),
            MULTI_GET: _path_item("A multi-get by POST.", _secured(_multi_get_operations()), ("collection",)),
        },
        "components": {
            "schemas": _schemas(max_ids),
            "parameters": _parameters(max_ids),
            "headers": _headers(),
            "responses": {"MethodNotAllowed": _errors((405,))["405"]},
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token made with `python -m api keys create`; only its SHA-256 is stored.",
                }
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
