"""The schemas of ``POST /v1/_batch``: its operations, its request and its results."""

from __future__ import annotations

from typing import List

from handlers.http import validation
from handlers.openapi.parts import Json, closed, ref

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
    properties = {"op": {"const": op}, "collection": ref("schemas", "CollectionName"), **members}
    return closed(properties, ["op", "collection", *required], description)


def batch_schemas() -> Json:
    """The request and answer of a batch."""
    document_id = ref("schemas", "DocumentId")
    document = ref("schemas", "Document")
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
            {"id": document_id, "patch": ref("schemas", "MergePatch"), "if_match": _TAGS},
            ["id", "patch"],
        ),
        "BatchDelete": _operation_schema(
            "delete", "Delete a document (204).", {"id": document_id, "if_match": _TAGS}, ["id"]
        ),
    }
    return {
        **operations,
        "BatchRequest": closed(
            {
                "operations": {
                    "type": "array",
                    "minItems": 1,
                    "description": "Carried out in this order; at most `JETWAY_MAX_BATCH_OPS` (1,000 by default).",
                    "items": {"oneOf": [ref("schemas", name) for name in operations]},
                }
            },
            ["operations"],
            "Document operations to carry out in one request.",
        ),
        "BatchResult": closed(
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
                "problem": ref("schemas", "Problem"),
            },
            ["status"],
            "One operation's outcome: `id` and `etag` (and `document`) when it succeeded, `problem` when not.",
        ),
        "BatchResults": closed(
            {"results": {"type": "array", "items": ref("schemas", "BatchResult")}},
            ["results"],
            "One result per operation, in the order given.",
        ),
    }
