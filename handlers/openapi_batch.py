"""The OpenAPI description of ``POST /v1/_batch``: its path and its schemas.

Kept apart from ``handlers.openapi`` (whose small builders it uses) so that
module stays the single-document API; ``openapi_document`` adds what this
module builds.
"""

from __future__ import annotations

from typing import List

from handlers.base import JSON_TYPE
from handlers.http import validation
from handlers.openapi import (
    _KEY_IN_USE,
    _KEY_REUSED,
    Json,
    _body,
    _errors,
    _object,
    _operation,
    _parameters_named,
    _ref,
    _response,
)

BATCH = "/v1/_batch"

_TAGS = {
    "type": "string",
    "description": "Entity tags as in the header of the same name (`*`, or a list); a variant's tag counts as its own.",
}
_TTL = {
    "type": "integer",
    "minimum": 1,
    "maximum": validation.MAX_TTL,
    "description": "Seconds the document lives; without it, a put keeps the document's expiry.",
}


def _operation_schema(op: str, description: str, members: Json, required: List[str]) -> Json:
    properties = {"op": {"const": op}, "collection": _ref("schemas", "CollectionName"), **members}
    return _object(properties, ["op", "collection", *required], description)


def batch_schemas() -> Json:
    """The request and answer of a batch."""
    document_id = _ref("schemas", "DocumentId")
    document = _ref("schemas", "Document")
    operations = {
        "BatchGet": _operation_schema("get", "Read a document.", {"id": document_id}, ["id"]),
        "BatchPut": _operation_schema(
            "put",
            "Create or replace a document (201 or 200).",
            {"id": document_id, "document": document, "if_match": _TAGS, "if_none_match": _TAGS, "ttl": _TTL},
            ["id", "document"],
        ),
        "BatchCreate": _operation_schema(
            "create", "Create a document under a new id (201).", {"document": document, "ttl": _TTL}, ["document"]
        ),
        "BatchPatch": _operation_schema(
            "patch",
            "Merge-patch a document (RFC 7396); it merges into what earlier operations of the batch left.",
            {"id": document_id, "patch": _ref("schemas", "MergePatch"), "if_match": _TAGS},
            ["id", "patch"],
        ),
        "BatchDelete": _operation_schema(
            "delete", "Delete a document (204).", {"id": document_id, "if_match": _TAGS}, ["id"]
        ),
    }
    return {
        **operations,
        "BatchRequest": _object(
            {
                "operations": {
                    "type": "array",
                    "minItems": 1,
                    "description": "Carried out in this order; at most `JETWAY_MAX_BATCH_OPS` (1,000 by default).",
                    "items": {"oneOf": [_ref("schemas", name) for name in operations]},
                }
            },
            ["operations"],
            "Document operations to carry out in one request.",
        ),
        "BatchResult": _object(
            {
                "status": {
                    "type": "integer",
                    "minimum": 200,
                    "maximum": 599,
                    "description": "The status the operation would have had as a request of its own.",
                },
                "id": document_id,
                "etag": {"type": "string", "description": "The document's ETag (a get's, or a write's new one)."},
                "document": {
                    **document,
                    "description": "The document as stored (left out of writes by `Prefer: return=minimal`).",
                },
                "problem": _ref("schemas", "Problem"),
            },
            ["status"],
            "One operation's outcome: `id` and `etag` (and `document`) when it succeeded, `problem` when not.",
        ),
        "BatchResults": _object(
            {"results": {"type": "array", "items": _ref("schemas", "BatchResult")}},
            ["results"],
            "One result per operation, in the order given.",
        ),
    }


def batch_operations() -> Json:
    post = _operation(
        "runBatch",
        "Many document operations in one request, each answered as it would be alone (not atomic)",
        "batch",
        {
            "200": _response(
                "Every operation was carried out or refused on its own; see each result's `status`. A write"
                " whose replicas did not confirm it has a 503 `not-replicated` result. A get whose document would"
                " take the gets' documents past `JETWAY_MAX_RESPONSE_BYTES` has a 413 `response-too-large` result"
                " (the others go on). With an `Idempotency-Key`,"
                " perhaps the first attempt's answer again, marked `Idempotency-Replayed`.",
                _ref("schemas", "BatchResults"),
                ("Idempotency-Replayed",),
            ),
            **_errors(
                (400, 401, 409, 413, 415, 422, 429, 500, 502, 503, 504),
                e400='Malformed JSON, not `{"operations": [...]}`, an empty list, or an invalid `Idempotency-Key`.'
                " An operation that is malformed on its own is refused in its result, not here.",
                e409=_KEY_IN_USE,
                e413="More operations than `JETWAY_MAX_BATCH_OPS` or than the token's burst (`batch-too-large`),"
                " or a body over `JETWAY_MAX_BATCH_BYTES` (`body-too-large`); nothing was done.",
                e422=_KEY_REUSED,
                e429="Over the token's rate: a batch costs one request per operation.",
            ),
        },
        parameters=_parameters_named("Idempotency-Key", "Prefer"),
        requestBody=_body(JSON_TYPE, "The operations, in order.", "BatchRequest"),
    )
    return {"post": post}
