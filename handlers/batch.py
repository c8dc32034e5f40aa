"""``POST /v1/_batch``: many document operations in one request, each answered as it would be alone.

The body is ``{"operations": [{"op": "put", "collection": "users", "id":
"u1", "document": {...}, "if_match": "...", "ttl": 60}, ...]}`` with ``op``
one of get, put, create (no id: one is made), patch (``patch``: a merge
patch) and delete. The answer is 200 ``{"results": [...]}``, one result per
operation in order: its ``status``, ``id``, ``etag`` and ``document`` (the
stored bytes, inlined as they are; ``Prefer: return=minimal`` leaves them
out of write results), or the ``problem`` it would have had alone. The
batch itself is refused only when it is malformed as a whole (400), too
large (413, before anything is written) or not authorized at all (401, 429).

Each operation is authorized on its own collection, checked as its single
request would be, then all go to Redis together (``cache.batch``: not
atomic across documents). A document written by a batch is stored as the
compact serialization of its JSON value: it arrives inside the batch's own
JSON, so there are no bytes of its own to keep verbatim.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from twisted.internet import defer

from cache import codec
from cache.batch import CREATE, DELETE, GET, PATCH, PUT, BatchRunner, Operation, OperationResult
from cache.idempotency import StoredResponse
from cache.store import Conditions
from cache.variants import base_tag
from handlers import validation
from handlers.auth import may
from handlers.base import JSON_TYPE, ResourceHandler, as_api_error
from handlers.errors import ApiError, bad_request
from handlers.idempotency import respond_once

_FIELDS: Dict[str, Tuple[str, ...]] = {
    GET: ("op", "collection", "id"),
    PUT: ("op", "collection", "id", "document", "if_match", "if_none_match", "ttl"),
    CREATE: ("op", "collection", "document", "ttl"),
    PATCH: ("op", "collection", "id", "patch", "if_match"),
    DELETE: ("op", "collection", "id", "if_match"),
}
_STATUS = {GET: 200, PATCH: 200, DELETE: 204, CREATE: 201}
# A checked operation, or the problem it would have had alone.
Checked = Union[Operation, ApiError]


class BatchHandler(ResourceHandler):
    ROUTE = "batch"
    SUPPORTED_METHODS = ("POST", "OPTIONS")

    def initialize(self, batches: BatchRunner, max_operations: int, **documents: Any) -> None:
        super().initialize(**documents)
        self.batches = batches
        self.max_operations = max_operations

    def prepare(self) -> Optional[defer.Deferred]:
        if self.request.method == "OPTIONS":
            return None
        body = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, len(self.request.body)
        )
        operations = body.get("operations")
        if set(body) != {"operations"} or not isinstance(operations, list) or not operations:
            raise bad_request('the body must be {"operations": [...]}: a non-empty array, and no other member')
        if len(operations) > self.max_operations:
            raise ApiError(
                413, "batch-too-large", f"{len(operations)} operations; a batch holds at most {self.max_operations}"
            )
        self.operations = operations
        authorization = self.request.headers.get("Authorization")
        return self.gate.admit_batch(authorization, len(operations)).addCallback(self._admitted)

    def post(self) -> defer.Deferred:
        checked = [self._check(raw) for raw in self.operations]
        # Ids and ETags are chosen before anything is written: an
        # Idempotency-Key's retry writes with the same ones.
        plan = codec.dumps([[self.store.new_id().decode(), self.store.new_etag().decode()] for _ in checked])
        return respond_once(self, plan, lambda plan: self._run_batch(checked, plan))

    @defer.inlineCallbacks
    def _run_batch(self, checked: List[Checked], plan: bytes) -> Any:
        planned = json.loads(plan)
        ready = [_planned(item, ids) if isinstance(item, Operation) else item for item, ids in zip(checked, planned)]
        operations = [item for item in ready if isinstance(item, Operation)]
        results = yield self.batches.run(operations) if operations else defer.succeed([])
        answers = iter(results)
        minimal = "return=minimal" in self.request.headers.get("Prefer", "").replace(" ", "")
        parts = [_result(next(answers), minimal) if isinstance(item, Operation) else _problem(item) for item in ready]
        return StoredResponse(200, (("Content-Type", JSON_TYPE),), b'{"results":[' + b",".join(parts) + b"]}")

    def _check(self, raw: Any) -> Checked:
        """An operation as a single request would be checked: its shape, its scope, its document."""
        try:
            return self._operation(raw)
        except ApiError as error:
            return error

    def _operation(self, raw: Any) -> Operation:
        if not isinstance(raw, dict) or raw.get("op") not in _FIELDS:
            raise bad_request('an operation is an object whose "op" is get, put, create, patch or delete')
        op = raw["op"]
        unknown = set(raw) - set(_FIELDS[op])
        if unknown:
            raise bad_request(f"a {op} takes no {', '.join(sorted(unknown))}")
        collection = validation.collection_name(_text(raw, "collection"))
        doc_id = b"" if op == CREATE else validation.document_id(_text(raw, "id"))
        if self.grant.record is not None and not may(self.grant.record.scopes, collection.decode(), op != GET):
            raise ApiError(
                403, "forbidden", f"the token may not {'read' if op == GET else 'write'} {collection.decode()}"
            )
        conditions = Conditions(_tags(raw, "if_match", weak=False), _tags(raw, "if_none_match", weak=True))
        ttl = raw.get("ttl")
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool)):
            raise bad_request(f"ttl must be a whole number from 1 to {validation.MAX_TTL}", "invalid-ttl")
        seconds = validation.ttl(None if ttl is None else str(ttl))
        body, patch = None, None
        if op in (PUT, CREATE):
            body = self._document(raw, "document")
        elif op == PATCH:
            patch = raw.get("patch")
            if not isinstance(patch, dict):
                raise bad_request("a patch's patch must be a JSON object", "not-an-object")
        return Operation(op, collection, doc_id, body, patch, conditions, b"%d" % (seconds or 0), None, self.max_body)

    def _document(self, raw: Dict[str, Any], name: str) -> bytes:
        value = raw.get(name)
        if not isinstance(value, dict):
            raise bad_request(f"a {raw['op']}'s {name} must be a JSON object", "not-an-object")
        body = codec.dumps(value)
        if len(body) > self.max_body:
            raise ApiError(413, "body-too-large", f"the document is {len(body)} bytes; the limit is {self.max_body}")
        return body


def _text(raw: Dict[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string")
    return value


def _tags(raw: Dict[str, Any], name: str, weak: bool) -> bytes:
    value = raw.get(name)
    if value is None:
        return b""
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string of entity tags, as in the header")
    tags = validation.entity_tags(value, weak)
    return tags if tags in (b"", b"*") else b" ".join(base_tag(tag) for tag in tags.split())


def _planned(operation: Operation, ids: Sequence[str]) -> Operation:
    """``operation`` with the plan's id (a create's) and ETag (a write's)."""
    doc_id, etag = ids[0].encode(), ids[1].encode()
    return Operation(
        operation.op,
        operation.collection,
        doc_id if operation.op == CREATE else operation.doc_id,
        operation.body,
        operation.patch,
        operation.conditions,
        operation.ttl,
        None if operation.op == GET else etag,
        operation.max_size,
        operation.check,
    )


def _result(result: OperationResult, minimal: bool) -> bytes:
    """One operation's result, put together around the stored bytes (never parsed)."""
    if result.error is not None:
        problem = as_api_error(result.error)
        if problem is None:
            raise result.error  # a bug: the whole request fails as such
        return _problem(problem)
    operation, document = result.operation, result.document
    status = 201 if operation.op == PUT and result.created else _STATUS.get(operation.op, 200)
    head = b'{"status":%d,"id":%s' % (status, codec.dumps(operation.doc_id.decode()))
    if document is None:
        return head + b"}"
    head += b',"etag":' + codec.dumps(document.etag.decode())
    if minimal and operation.op != GET:
        return head + b"}"
    return head + b',"document":' + document.body + b"}"


def _problem(error: ApiError) -> bytes:
    return b'{"status":%d,"problem":%s}' % (error.status_code, codec.dumps(error.as_problem()))
