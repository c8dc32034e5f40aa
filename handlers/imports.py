"""``POST /v1/_import/{coll}``: documents from an NDJSON body, written as the body arrives.

The body is read in groups of ``GROUP`` lines (``handlers.ndjson_lines``)
from the request's ``BodyStream``, which the connection fills as the socket
brings it and stops filling while a group is written (back-pressure:
``api.streamed_body``). Each line is checked as a PUT's body is (the strict
JSON reader, an object, the collection's size limit and schema) and
written through the store's own writes (so the change feed, the index and
the hot caches stay exact), a group's writes pipelined together; a line
refused is reported by number, and the import goes on.

A document's id is the string at the request's ``id`` (a JSON Pointer) or
``id_field`` (a top-level member), else a new ULID. With ``with_ids=1``
each line is ``{"id": ..., "doc": {...}}`` (what the export writes with
``with_ids=1``, ``handlers.exports``) and the document stored is the
``doc`` member's bytes as they are in the line when the line has the
export's form, else its compact serialization. An upload cut short is
resumed without writing a line twice: ``from_line=N`` skips the lines
before N, and under an ``Idempotency-Key`` the import holds a lease on the
key for as long as it runs and records the last line of each group written
(``cache.documents.import_progress``); a retry with the key goes on after it, and
writes each line with the ETag and new id its plan gives that line, so a
line written but not yet recorded is found written, not written twice.
While an import holds its key, another with the same key is a 409
``idempotency-key-in-use``. A group's lines all written or refused is what
"written" means. A group's writes go as a batch's do (``cache.batches.batch``: one
script call per slot group), and the next group is read and checked while
Redis writes them: at most two groups in flight.

An import that ends early, for any reason (a malformed chunk, its body's
deadline, Redis failing, its lease lost), answers its error with what it
did: the report's members (``complete: false``, ``written``,
``last_line``) and ``resume_from_line``, after the group in flight has
settled, so the answer says exactly which lines are written.

A caller bound by the collection's owner rule (``handlers.ownership``)
imports each line as its single PUT would be written: the owner member
filled in or checked (a line naming another owner is that line's 403), the
group's existing documents read at once before it is written (one round
trip, ``handlers.batch_ownership.pin_writes``, as a batch's are), a line
over another's document refused (403), and each line's write pinned to the
version read, so a write by someone else in between makes that line a 412,
never an overwrite. A bound group is read and written once the group
before it is written (no overlap). Unbound callers' imports take none of
these steps.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from twisted.internet import defer

from cache.batches.batch import CREATE, PUT, BatchRunner, Operation
from cache.batches.segments import SEGMENT_BYTES
from cache.collection_settings import CollectionSettings
from cache.documents.import_progress import Lease, LeaseLost, Plan
from cache.documents.write_plan import plan_write
from cache.json import codec
from handlers.base import ResourceHandler
from handlers.batch_ownership import Owners, owners_of, pin_writes
from handlers.http import validation
from handlers.http.body_stream import BodyLost, BodyStream
from handlers.http.errors import ApiError, bad_request
from handlers.http.problems import as_api_error, problem_of
from handlers.idempotency import HEADER as IDEMPOTENCY_HEADER
from handlers.idempotency import idempotency_key
from handlers.ndjson_lines import ImportReport, Line, LineReader
from handlers.ownership import owned_document

NDJSON = "application/x-ndjson"
GROUP = 100
MAX_LINE_NUMBER = 2**53
IdOf = Callable[[Any], Optional[bytes]]
# What a with_ids line adds to its document: {"id":"<an id of up to 128 bytes>","doc":...}.
WRAPPER_BYTES = 256
WITH_IDS = ["id"]  # a with_ids line's id is at /id
# An array index in a JSON Pointer (RFC 6901): ASCII digits, no leading zero; str.isdigit() takes "²" too.
ARRAY_INDEX = re.compile(r"0|[1-9][0-9]{0,15}")


def with_ids_flag(text: Optional[str]) -> bool:
    """The ``with_ids`` query flag: ``1``/``true`` or ``0``/``false``."""
    if text is None or text in ("0", "false"):
        return False
    if text in ("1", "true"):
        return True
    raise bad_request("with_ids must be 1 or 0 (true or false)", "invalid-with-ids")


def unwrapped(line: bytes, value: Any, doc_id: bytes) -> Tuple[Any, bytes]:
    """A with_ids line's document and its bytes: as they are in the line when it has the export's form."""
    if not isinstance(value, dict) or set(value) != {"id", "doc"} or not isinstance(value["doc"], dict):
        raise bad_request('with with_ids=1 each line is {"id": "<id>", "doc": {...}}', "not-an-id-and-doc")
    prefix = b'{"id":"' + doc_id + b'","doc":'
    if line.startswith(prefix) and line.endswith(b"}"):
        return value["doc"], line[len(prefix) : -1].strip(b" \t\r")
    return value["doc"], codec.dumps(value["doc"])


def id_source(pointer: Optional[str], member: Optional[str]) -> Optional[List[str]]:
    """The path to a line's id: a JSON Pointer's tokens (RFC 6901), a member's name, or None (new ULIDs)."""
    if pointer is not None and member is not None:
        raise bad_request("give id or id_field, not both", "invalid-id-source")
    if member is not None:
        return [member]
    if pointer is None:
        return None
    if not pointer.startswith("/"):
        raise bad_request("id must be a JSON Pointer, such as /id", "invalid-id-source")
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def id_at(value: Any, path: List[str]) -> bytes:
    """The document id at ``path`` in ``value``: a string that is a valid id, or a 400."""
    for token in path:
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and ARRAY_INDEX.fullmatch(token) and int(token) < len(value):
            value = value[int(token)]
        else:
            raise bad_request("the line has no id at " + "/" + "/".join(path), "missing-id")
    if not isinstance(value, str):
        raise bad_request("the line's id must be a string", "invalid-id")
    return validation.document_id(value)


@dataclass(frozen=True)
class Group:
    """What each group of an import is written with: its collection, TTL, id path, and its key's lease and plan."""

    collection: bytes
    ttl: Optional[int]
    path: Optional[List[str]]
    lease: Optional[Lease]
    plan: Optional[Plan]


def line_number(text: Optional[str]) -> int:
    if text is None:
        return 1
    if not text.isdigit() or not 1 <= int(text) <= MAX_LINE_NUMBER:
        raise bad_request("from_line must be a line number, from 1", "invalid-from-line")
    return int(text)


class ImportHandler(ResourceHandler):
    ROUTE = "import"

    def initialize(self, batches: BatchRunner, **dependencies: Any) -> None:
        super().initialize(**dependencies)
        self.batches = batches

    @defer.inlineCallbacks
    def post(self, collection: str) -> Any:
        name = validation.collection_name(collection)
        validation.require_media_type(self.request.headers.get("Content-Type"), NDJSON)
        path = id_source(self.query_argument("id"), self.query_argument("id_field"))
        self.with_ids = with_ids_flag(self.query_argument("with_ids"))
        if self.with_ids and path is not None:
            raise bad_request("give with_ids, or id or id_field, not both", "invalid-id-source")
        ttl = validation.ttl(self.query_argument("ttl"))
        key = idempotency_key(self.request.headers.get(IDEMPOTENCY_HEADER))
        report = ImportReport(line_number(self.query_argument("from_line")) - 1)
        if key is None:
            yield self._run(Group(name, ttl, path, None, None), report)
            return
        digest = self.grant.record.digest if self.grant.record is not None else b""
        claimed = yield self.idempotency.imports.claim(digest, name, key, self.application.clock)
        if claimed.lease is None:
            # Retry soon: the running import frees the key as it answers. One that died holds it until its
            # lease runs out, which the detail tells.
            raise ApiError(
                409,
                "idempotency-key-in-use",
                "an import with this Idempotency-Key is still running (its lease runs out in"
                f" {math.ceil(claimed.busy_for)} s unless renewed); retry in 1 s",
                {"Retry-After": "1"},
            )
        report.resumed_after = max(report.resumed_after, claimed.last_line)
        plan = Plan.of(digest, name, key, claimed.since_ms)
        try:
            yield self._run(Group(name, ttl, path, claimed.lease, plan), report)
        finally:
            # Before the answer is sent, so that a retry it prompts finds the key free.
            yield claimed.lease.release().addErrback(lambda _: None)  # else it runs out

    @defer.inlineCallbacks
    def _run(self, group: Group, report: ImportReport) -> Any:
        rules = yield self.collection_settings(group.collection)
        owners = owners_of(self.grant, {group.collection: rules})  # empty unless the owner rule binds the caller
        reader = LineReader(
            getattr(self.request, "body_stream", None) or BodyStream.of(self.request.body),
            self.max_body + WRAPPER_BYTES * self.with_ids,
        )
        # The group Redis is writing, and the number of its last line: the next group is read, checked and
        # sent meanwhile (the worker's work and Redis's overlap; one link keeps them in order).
        in_flight: Optional[Tuple[defer.Deferred, int]] = None
        recording = False  # a group's write or record is what failed: the one after it must not be recorded
        try:
            while not reader.ended:
                lines = yield reader.group(GROUP)
                if not lines:
                    continue
                if group.lease is not None:
                    group.lease.check()  # never a group sent on a lease that may be another's
                if owners and in_flight is not None:
                    # A bound group reads its documents' versions once the group before is written: read
                    # before, a document both name would be pinned to the version that group replaces.
                    recording = True
                    yield self._written(*in_flight, report, group)
                    recording, in_flight = False, None
                writing = self._write_group(group, lines, rules, report, owners)
                if in_flight is not None:
                    recording = True
                    yield self._written(*in_flight, report, group)
                    recording = False
                in_flight = (writing, reader.number)
            if in_flight is not None:
                written, in_flight = in_flight, None
                yield self._written(*written, report, group)
        except Exception as error:
            if in_flight is not None:
                # Let it settle, so the answer says exactly what is written; after a group that failed, its
                # lines are counted but the resume point stays before the failed one (a resume finds them written).
                settling = in_flight[0] if recording else self._written(*in_flight, report, group)
                yield settling.addErrback(lambda _: None)
            raise self._cut_short(error, report) from error
        if isinstance(reader.error, BodyLost):
            return  # no one to answer: what was read whole is written
        if reader.error is not None:
            raise self._cut_short(reader.error, report)
        self.send_bytes(200, codec.dumps(report.as_json(True)))

    def _cut_short(self, error: Exception, report: ImportReport) -> ApiError:
        """The import's error, carrying what it wrote: the report, and the line to resume from."""
        if isinstance(error, LeaseLost):
            problem = ApiError(409, "idempotency-key-lost", "the import lost its Idempotency-Key's lease; resume it")
        else:
            problem = problem_of(error, "POST", self.request.path)
        extensions = {**problem.extensions, **report.as_json(False), "resume_from_line": report.last_line + 1}
        return ApiError(problem.status_code, problem.problem, problem.detail, problem.headers, extensions)

    @defer.inlineCallbacks
    def _write_group(
        self, group: Group, lines: List[Line], rules: CollectionSettings, report: ImportReport, owners: Owners
    ) -> Any:
        numbers: List[int] = []
        operations: List[Operation] = []
        keyed = group.plan
        for number, body in lines:
            if number <= report.resumed_after:
                report.skipped += 1
                continue
            try:
                doc_id, document, value = self._checked(body, group.path)
                new_id = doc_id or (keyed.new_id(number) if keyed is not None else self.store.new_id())
                if owners:  # the line as its writer's: its owner member filled in or checked, as a PUT's
                    settings, owner = owners[group.collection]
                    value, document = owned_document(settings.owner, owner, value, document)  # type: ignore[arg-type]
                plan = plan_write(rules, value, len(document), new_id, group.ttl)
            except Exception as error:  # an ApiError, or the schema's violation (mapped as a PUT's is)
                refusal = as_api_error(error)
                if refusal is None:
                    raise
                report.refuse(number, refusal)
                continue
            op = PUT if doc_id is not None else CREATE
            etag = keyed.etag(number) if keyed is not None else None
            if owners and etag is None:
                etag = self.store.new_etag()  # a pinned write's ETag is chosen first (handlers.batch_ownership)
            operations.append(
                Operation(
                    op,
                    group.collection,
                    new_id,
                    document,
                    ttl=plan.expiry,
                    etag=etag,
                    replicas=plan.replicas,
                    indexed=plan.indexed,
                )
            )
            numbers.append(number)
        if owners and operations:
            numbers, operations = yield self._pinned(owners, numbers, operations, report)
        # The group's writes as a batch's: one script call per slot group, not one each (cache.batches.groups).
        results = (yield self.batches.run(operations, minimal=True)) if operations else []
        for number, result in zip(numbers, results):
            if result.error is None:
                report.count_written(result.created)
                continue
            error = as_api_error(result.error)
            if error is None or (error.status_code >= 500 and error.problem != "not-replicated"):
                raise result.error
            report.refuse(number, error)

    @defer.inlineCallbacks
    def _pinned(self, owners: Owners, numbers: List[int], operations: List[Operation], report: ImportReport) -> Any:
        """A bound group's lines judged against their documents, read in one round trip, and pinned to them;
        each refused (another's document, the line's own conditions) is reported by its number."""
        ready = yield pin_writes(self.batches, operations, owners, self.max_body, SEGMENT_BYTES)
        kept: Tuple[List[int], List[Operation]] = ([], [])
        for number, item in zip(numbers, ready):
            if isinstance(item, ApiError):
                report.refuse(number, item)
            else:
                kept[0].append(number)
                kept[1].append(item)
        return kept

    @defer.inlineCallbacks
    def _written(self, writing: defer.Deferred, last_line: int, report: ImportReport, group: Group) -> Any:
        """A group written whole (or its failure raised): its last line is done, and recorded under the key."""
        yield writing
        report.last_line = last_line
        if group.lease is not None:
            yield group.lease.record(last_line)

    def _checked(self, line: Optional[bytes], path: Optional[List[str]]) -> Tuple[Optional[bytes], bytes, Any]:
        """The line's id (None: a new one), document and its parsed value, once it is a document; else an
        ApiError. Its collection's settings then plan it (``cache.documents.write_plan``), as any write's."""
        room = self.max_body + WRAPPER_BYTES * self.with_ids
        if line is None:
            raise ApiError(413, "line-too-large", f"the line is larger than {room} bytes")
        if not self.with_ids:
            value = validation.json_document(line, validation.JSON, validation.JSON, self.max_body)
            doc_id = id_at(value, path) if path is not None else None
            return doc_id, line, value
        value = validation.json_document(line, validation.JSON, validation.JSON, room)
        doc_id = id_at(value, WITH_IDS)
        value, body = unwrapped(line, value, doc_id)
        if len(body) > self.max_body:
            raise ApiError(413, "body-too-large", f"the document is {len(body)} bytes; the limit is {self.max_body}")
        return doc_id, body, value
