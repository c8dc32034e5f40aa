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
The documents its gets bring share one byte budget
(``JETWAY_MAX_RESPONSE_BYTES``): a get past it gets its own 413
``response-too-large``, in order, and the other operations, writes above
all, go as they would (``cache.batches.batch``).

Each operation is authorized on its own collection, checked as its single
request would be (its collection's settings too: the schema and
``max_bytes`` refuse a put, create or merged patch with that operation's own
422 or 413, a put or create without ``ttl`` gets the default TTL, and the
batch waits for the most ``write_replicas`` any of its writes asks for),
then all go to Redis together (``cache.batches.batch``: not
atomic across documents). A document written by a put or create is stored
as its own bytes in the batch's body, verbatim (``cache.json.spans`` finds
them once the whole body has passed the strict reader), as a single PUT
stores its body: its whitespace and escapes are the client's.

A caller bound by a collection's owner rule (``handlers.ownership``) has
each of its operations on that collection answered as that operation's
single request would be (``handlers.batch_ownership``): another's document
is a missing one's result, its writes are its own and pinned.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from twisted.internet import defer

from cache.batches.batch import CREATE, DELETE, GET, PATCH, PUT, BatchRunner, Operation, OperationResult
from cache.collection_settings import CollectionSettings
from cache.documents.bounded_reads import OverBudget
from cache.documents.idempotency import StoredResponse
from cache.documents.store import NO_CONDITIONS, Conditions
from cache.documents.variants import base_tag
from cache.documents.write_plan import KEPT, keeping, patch_planner, plan_write
from cache.json import codec
from cache.json.spans import Span, element_member_spans
from cache.memory_return import MemoryReturn
from cache.turns import in_turns
from handlers.base import JSON_TYPE, ResourceHandler, as_api_error, too_large
from handlers.batch_ownership import judged, owned_gets, owned_write, owners_of, pin_writes
from handlers.http import validation
from handlers.http.auth import may
from handlers.http.errors import ApiError, bad_request
from handlers.idempotency import respond_once

_FIELDS: Dict[str, Tuple[str, ...]] = {
    GET: ("op", "collection", "id"),
    PUT: ("op", "collection", "id", "document", "if_match", "if_none_match", "ttl"),
    CREATE: ("op", "collection", "document", "ttl"),
    PATCH: ("op", "collection", "id", "patch", "if_match"),
    DELETE: ("op", "collection", "id", "if_match"),
}
_ALLOWED = {op: frozenset(fields) for op, fields in _FIELDS.items()}
_STATUS = {GET: 200, PATCH: 200, DELETE: 204, CREATE: 201}
# A checked operation, or the problem it would have had alone.
Checked = Union[Operation, ApiError]
# A put's or create's ttl member left out: the collection's default applies (replaced before the run).
_NO_TTL = b""
# An entity tag with nothing to escape in JSON but its two quotes.
_PLAIN_TAG = re.compile(rb'"[0-9A-Za-z._-]*"\Z')


class BatchHandler(ResourceHandler):
    ROUTE = "batch"

    def initialize(
        self, batches: BatchRunner, max_operations: int, response_budget: int, memory: MemoryReturn, **documents: Any
    ) -> None:
        super().initialize(**documents)
        self.batches = batches
        self.max_operations = max_operations
        self.response_budget = response_budget
        self.memory = memory

    def prepare(self) -> Optional[defer.Deferred]:
        if self.request.method == "OPTIONS":
            return None
        body = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, len(self.request.body)
        )
        operations = body.get("operations")
        if set(body) != {"operations"} or not isinstance(operations, list) or not operations:
            raise bad_request(
                'the body must be {"operations": [...]}: a non-empty array, and no other member', "invalid-batch"
            )
        if len(operations) > self.max_operations:
            raise ApiError(
                413, "batch-too-large", f"{len(operations)} operations; a batch holds at most {self.max_operations}"
            )
        self.operations = operations
        # Each operation's document as the body holds it (its bytes, stored as a single PUT stores its body).
        self.documents = element_member_spans(self.request.body, "operations", "document")
        return super().prepare()  # the token's; each operation's scope on its collection is checked with it

    def admission_cost(self) -> int:
        return len(self.operations)  # a batch costs one request of the token's rate per operation

    def post(self) -> defer.Deferred:
        # A batch of 1,000 operations is checked, planned, run and rendered
        # in slices of bounded time (cache.turns), the worker's other
        # clients served in between.
        turns = in_turns(self.application.clock, self.operations, self._check)
        return turns.addCallback(self._plan)

    def _plan(self, checked: List[Checked]) -> defer.Deferred:
        values = [
            raw.get("document") if isinstance(item, Operation) else None for item, raw in zip(checked, self.operations)
        ]
        self.operations = []  # the parsed body: only the documents' values are wanted past here (schemas)
        # Ids and ETags are chosen before anything is written: an
        # Idempotency-Key's retry writes with the same ones.
        # Only a create needs a new id (a ULID is the dearer of the two).
        chosen = [
            [self.store.new_id().decode() if _is(item, CREATE) else "", self.store.new_etag().decode()]
            for item in checked
        ]
        plan = codec.dumps(chosen)
        # A create's id is the first attempt's, unknown to a replay: no entry can predate it.
        writes = [
            (item.collection, item.doc_id)
            for item in checked
            if isinstance(item, Operation) and item.op in (PUT, PATCH, DELETE)
        ]
        # The plan run is this one unless an Idempotency-Key's claim holds an earlier attempt's: parsed only then.
        return respond_once(
            self,
            plan,
            lambda held: self._run_batch(checked, values, chosen if held is plan else json.loads(held)),
            writes,
        )

    @defer.inlineCallbacks
    def _run_batch(self, checked: List[Checked], values: List[Any], plan: List[List[str]]) -> Any:
        # Inside the Idempotency-Key's claim: an operation's 422 or 413 from
        # its collection's settings is part of the answer a retry gets again.
        rules = yield self._settings_of({item.collection for item in checked if isinstance(item, Operation)})
        owners = owners_of(self.grant, rules)  # where an owner rule binds the caller (handlers.batch_ownership)
        clock = self.application.clock
        # A put's document is checked against its collection's schema here: in slices too.
        ready = yield in_turns(
            clock,
            zip(checked, values, plan),
            lambda each: _ready(rules, *(owned_write(owners, *each) if owners else each)),
        )
        # Checked against their schemas: the parsed documents can go before the writes' round trip (a
        # retry under an Idempotency-Key runs this once at most, and its claim holds the plan, not these).
        values.clear()
        checked.clear()
        if owners:  # each bound write judged against its document as stored (one multi-read), and pinned to it
            ready = yield pin_writes(self.batches, ready, owners, self.max_body, self.response_budget)
            ready = owned_gets(ready, owners)  # each bound get sees only the caller's documents, in the budget too
        operations = [item for item in ready if isinstance(item, Operation)]
        fresh = validation.wants_fresh(self.request.headers.get("Cache-Control"))
        minimal = "return=minimal" in self.request.headers.get("Prefer", "").replace(" ", "")
        results = (
            self.batches.run(operations, fresh, self.response_budget, minimal) if operations else defer.succeed([])
        )
        answers = iter((yield results))
        if owners:
            answers = judged(answers, owners)
        parts = yield in_turns(clock, ready, lambda item: _rendered(item, answers, minimal))
        # One join of every piece, the documents among them as Redis gave them: no copy of each result first.
        body = b"".join(_framed(parts, b'{"results":[', b",", b"]}"))
        self.memory.after_batch(len(self.request.body) + len(body), len(body))
        return StoredResponse(200, (("Content-Type", JSON_TYPE),), body)

    def _settings_of(self, collections: Any) -> defer.Deferred:
        """Each collection's settings, read at once (most come from the worker's cache)."""
        names = sorted(collections)
        if len(names) == 1:  # the usual batch: its one collection's, with no list of Deferreds to gather
            return self.collection_settings(names[0]).addCallback(lambda found: {names[0]: found})
        reads = defer.gatherResults([self.collection_settings(name) for name in names], consumeErrors=True)
        return reads.addCallbacks(lambda found: dict(zip(names, found)), _first_error)

    def _check(self, raw: Any) -> Checked:
        """An operation as a single request would be checked: its shape, its scope, its document."""
        span = next(self.documents)  # first: the spans go in step with the operations, whatever is refused
        try:
            return self._operation(raw, span)
        except ApiError as error:
            return error

    def _operation(self, raw: Any, span: Optional[Span]) -> Operation:
        op = raw.get("op") if isinstance(raw, dict) else None
        # A string first: an object or array "op" is no key of _FIELDS, and looking it up would raise (a 500).
        if not isinstance(op, str) or op not in _FIELDS:
            raise bad_request(
                'an operation is an object whose "op" is get, put, create, patch or delete', "invalid-batch"
            )
        if not raw.keys() <= _ALLOWED[op]:
            unknown = set(raw) - _ALLOWED[op]
            raise bad_request(f"a {op} takes no {', '.join(sorted(unknown))}", "invalid-batch")
        collection = validation.collection_name(_text(raw, "collection"))
        doc_id = b"" if op == CREATE else validation.document_id(_text(raw, "id"))
        if self.grant.record is not None and not may(self.grant.record.scopes, collection.decode(), op != GET):
            raise ApiError(
                403, "forbidden", f"the token may not {'read' if op == GET else 'write'} {collection.decode()}"
            )
        if_match, if_none_match = _tags(raw, "if_match", weak=False), _tags(raw, "if_none_match", weak=True)
        conditions = Conditions(if_match, if_none_match) if if_match or if_none_match else NO_CONDITIONS
        ttl = raw.get("ttl")
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool)):
            raise bad_request(f"ttl must be a whole number from 1 to {validation.MAX_TTL}", "invalid-ttl")
        seconds = validation.ttl(None if ttl is None else str(ttl))
        given_ttl = _NO_TTL if seconds is None else b"%d" % seconds
        body, patch = None, None
        if op in (PUT, CREATE):
            body = self._document(raw, span)
        elif op == PATCH:
            patch = raw.get("patch")
            if not isinstance(patch, dict):
                raise bad_request("a patch's patch must be a JSON object", "not-an-object")
        return Operation(op, collection, doc_id, body, patch, conditions, given_ttl, None, self.max_body)

    def _document(self, raw: Dict[str, Any], span: Optional[Span]) -> bytes:
        """The document's own bytes in the batch's body, checked as a single PUT checks its body."""
        if not isinstance(raw.get("document"), dict):
            raise bad_request(f"a {raw['op']}'s document must be a JSON object", "not-an-object")
        assert span is not None  # the member is there: it was parsed
        start, end = span
        if end - start > self.max_body:
            raise ApiError(413, "body-too-large", f"the document is {end - start} bytes; the limit is {self.max_body}")
        return self.request.body[start:end]


def _is(item: Checked, op: str) -> bool:
    return isinstance(item, Operation) and item.op == op


def _text(raw: Dict[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string", "invalid-batch")
    return value


def _tags(raw: Dict[str, Any], name: str, weak: bool) -> bytes:
    value = raw.get(name)
    if value is None:
        return b""
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string of entity tags, as in the header", "invalid-batch")
    tags = validation.entity_tags(value, weak)
    return tags if tags in (b"", b"*") else b" ".join(base_tag(tag) for tag in tags.split())


def _first_error(failure: Any) -> Any:
    """gatherResults' ``FirstError`` as the error it wraps (a Redis error maps to its status)."""
    failure.trap(defer.FirstError)
    return failure.value.subFailure


def _ready(rules: Dict[bytes, CollectionSettings], item: Checked, value: Any, ids: Sequence[str]) -> Checked:
    """A checked operation under its collection's settings, with the plan's id (a create's) and ETag (a write's).

    Or the problem its single request would get from those settings. The
    operation is made once, not copied by ``dataclasses.replace`` twice (a
    copy introspects the fields, a visible share of a batch under vmprof:
    docs/history/performance.md, "Batches at Redis's pace").
    """
    if not isinstance(item, Operation):
        return item
    operation = item
    if operation.op == GET:
        return operation
    rules_of = rules.get(operation.collection)
    doc_id = ids[0].encode() if operation.op == CREATE else operation.doc_id
    plan, planner = KEPT, None
    if rules_of is not None and operation.op in (PUT, CREATE):
        assert operation.body is not None
        ttl = None if operation.ttl == _NO_TTL else int(operation.ttl)
        try:
            plan = plan_write(rules_of, value, len(operation.body), doc_id, ttl)
        except Exception as error:
            problem = as_api_error(error)
            if problem is None:
                raise
            return problem
    elif rules_of is not None:
        plan = keeping(rules_of)  # a delete's or a patch's: the write concern
        if operation.op == PATCH:
            planner = patch_planner(rules_of, doc_id)  # its merged document, planned just before it is written
    return Operation(
        operation.op,
        operation.collection,
        doc_id,
        operation.body,
        operation.patch,
        operation.conditions,
        plan.expiry,
        ids[1].encode(),
        operation.max_size,
        planner,
        plan.replicas,
        plan.indexed,
    )


def _rendered(item: Checked, answers: Iterator[OperationResult], minimal: bool) -> List[bytes]:
    """The result of ``item``: the runner's next answer, or the problem it met before the run."""
    return _result(next(answers), minimal) if isinstance(item, Operation) else [_problem(item)]


def _result(result: OperationResult, minimal: bool) -> List[bytes]:
    """One operation's result, in pieces around the stored bytes (never parsed, nor copied here)."""
    if isinstance(result.error, OverBudget):
        return [_problem(too_large(result.error))]
    if result.error is not None:
        problem = as_api_error(result.error)
        if problem is None:
            raise result.error  # a bug: the whole request fails as such
        return [_problem(problem)]
    operation, document = result.operation, result.document
    status = 201 if operation.op == PUT and result.created else _STATUS.get(operation.op, 200)
    # An id is checked (validation.document_id) or made here (a ULID): nothing in it to escape.
    head = b'{"status":%d,"id":"%s"' % (status, operation.doc_id)
    if document is None:
        return [head + b"}"]
    head += b',"etag":' + _json_tag(document.etag)
    if result.omitted is not None:
        # Written, but its document would pass the answer's budget: the write's result without it.
        return [head + b',"document_omitted":' + codec.dumps(too_large(result.omitted).as_problem()) + b"}"]
    if minimal and operation.op != GET:
        return [head + b"}"]
    return [head + b',"document":', document.body, b"}"]


def _json_tag(etag: bytes) -> bytes:
    """An entity tag as a JSON string: the tags this store makes (``cache.documents.ids``) with no encoder called."""
    if _PLAIN_TAG.match(etag):
        return b'"\\"' + etag[1:-1] + b'\\""'
    return codec.dumps(etag.decode())


def _framed(parts: List[List[bytes]], opening: bytes, separator: bytes, closing: bytes) -> List[bytes]:
    """``opening``, the pieces of each result with ``separator`` between results, and ``closing``: to join once."""
    pieces = [opening]
    for index, result in enumerate(parts):
        if index:
            pieces.append(separator)
        pieces += result
    pieces.append(closing)
    return pieces


def _problem(error: ApiError) -> bytes:
    return b'{"status":%d,"problem":%s}' % (error.status_code, codec.dumps(error.as_problem()))
