"""Many document operations in one request: sent to Redis together, each with its own outcome.

Operations take effect in the order given, each as it would alone (the same
scripts, so a write and its index entry still change together), but a batch
is not atomic: one operation's failure leaves the others as they went, and
another client may write between them. Each operation's outcome is its own:
an ``OperationResult`` with the document or the error it met.

Round trips: the operations go to Redis in one pipeline (split by node and
put back in order on a cluster), the writes gathered into one script call
per slot group (``cache.batches.groups``), not one call each. A merge patch needs the document it merges
into first, so a batch with patches reads their documents in one pipeline
before; and a patch of a document that an earlier operation of the same
batch writes starts a new segment (read, then write), so that it merges
into what that operation left. A segment's patches read a bounded number
of bytes, measured in the same read (``cache.batches.segments``): 100
patches of small documents are one segment, 1 MiB documents go a few to
a segment, and a large merge has a reactor turn of its own. A patch is a compare-and-set on the
document it read: a writer outside the batch that changes it in between
makes that patch a ``WriteConflict``, to be retried.

With the store's hot cache (``cache.hot.cache``): a get of a document the
worker holds is answered from it, unless an earlier operation of its
segment writes that document (the pipeline has not run yet) or the request
asked for fresh reads; gets do not fill it. The entries of every document a
segment writes go before the segment's outcomes are read, whatever they
are, as a single write's do: the batch's answer is followed on this worker
by reads of what it wrote.

A byte budget (``JETWAY_MAX_RESPONSE_BYTES``, ``cache.documents.bounded_reads``)
bounds the documents the batch's gets bring, each get counted: when the
gets could not exceed it whatever is stored (their number times the
largest document fits), they are read as above. Otherwise the documents
they name are measured first (one pipelined ``HSTRLEN``, one more round
trip), the gets are admitted in order while their sizes fit (a document an
earlier operation of the batch writes counts at the size that operation
gives it), and each admitted get reads through ``scripts.READ_ONE_WITHIN``
with its size and a share of what is left, so their reads add up to the
budget at most even if documents grow meanwhile. A get past the budget, or
whose document outgrew its share, gets its own 413 (``OverBudget``) and the
other operations run as they would: a write never depends on a read's
size. Gets of one document in one segment, with no write of it between
them, read it once.

A get of a caller bound by an owner rule (``Operation.owned``) is measured
and read through the owner-checking scripts (``OWNED_SIZE``,
``READ_OWNED_ONE_WITHIN``; ``cache.ownership.OwnedReads``), and its hot-cache
hit judged (``OwnedReads.sees``), before anything counts it: another's
document is a missing one in the admission, the answer's budget and the
result alike.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from twisted.internet import defer, reactor

from cache import keys
from cache.batches.budget import AnswerBudget, admitted_gets
from cache.batches.groups import SegmentPlan
from cache.batches.operations import CREATE, DELETE, GET, PATCH, PUT, WRITES, Operation, OperationResult
from cache.batches.segments import PatchReads, segment_bytes, segments
from cache.batches.versions import Judge, Target, read_versions
from cache.documents import scripts
from cache.documents.bounded_reads import DEFAULT_BUDGET, OverBudget, not_built
from cache.documents.document import (
    Conditions,
    Document,
    PreparedDelete,
    PreparedPut,
    delete_outcome,
    put_outcome,
    read_command,
    stored_document,
)
from cache.documents.store import DocumentStore
from cache.documents.write_concern import WriteConcern
from cache.documents.write_plan import KEPT
from cache.errors import DocumentNotFound, DocumentTooLarge, NotReplicated, PreconditionFailed, WriteConflict
from cache.json import codec
from cache.json.merge_patch import merge_patch
from cache.ownership import OwnedReads
from cache.redis.link import Link
from cache.turns import in_turns

_SCRIPTS = [scripts.WRITE_MANY, scripts.PUT, scripts.DELETE, scripts.READ_ONE_WITHIN, scripts.READ_OWNED_ONE_WITHIN]
# The cap of a bound get that needs none (the batch's gets fit the budget whatever is stored).
_UNCAPPED = 1 << 53
# A merge of a document this large takes milliseconds of CPU, more under load: it gets a reactor turn of its own.
HEAVY_MERGE = 256 * 1024


class BatchRunner:
    """Carries out batches on a store's link; writes that wait for replicas go through ``write_link``.

    ``WAIT`` blocks the connection it is sent on, so a batch that waits
    (the deployment's write concern, or a collection's ``write_replicas``)
    sends its writes on the write pool, as the store's single writes do.
    """

    def __init__(
        self,
        store: DocumentStore,
        link: Link,
        concern: WriteConcern,
        write_link: Optional[Link] = None,
        clock: Optional[Any] = None,
        spans_slots: bool = False,
    ) -> None:
        if concern.waits and write_link is None:
            raise ValueError("a write concern that waits for replicas needs a write link")
        self._clock = reactor if clock is None else clock  # the worker's reactor, as cache.redis.resp's timers
        self._store = store
        self._link = link
        self._write_link = write_link
        self._concern = concern
        # Whether one script may name keys of any slot (one Redis, not a cluster): cache.batches.groups.
        self._spans_slots = spans_slots

    @defer.inlineCallbacks
    def run(
        self, operations: Sequence[Operation], fresh: bool = False, budget: int = DEFAULT_BUDGET, minimal: bool = False
    ) -> Any:
        """Fires with an ``OperationResult`` per operation, in order; ``fresh``: gets read Redis, not the hot cache.

        ``budget``: the bytes of documents the results may carry, together
        (``minimal``: writes' results carry none, ``Prefer: return=minimal``).
        """
        concern = self.concern_of(operations)
        if concern.waits and self._write_link is None:
            raise ValueError("a write concern that waits for replicas needs a write link")
        results: List[OperationResult] = [OperationResult(operation) for operation in operations]
        caps = yield self._budget_gets(results, budget, minimal)
        answer = AnswerBudget(budget, minimal)
        reads = PatchReads(segment_bytes(budget))
        for start, end in segments(operations):
            while start < end:
                done = yield self._run_segment(results, start, end, concern, fresh, caps, reads)
                answer.spend(results[start:done])
                start = done
        return results

    def versions(self, targets: Sequence[Target], max_size: int, budget: int, judge: Judge) -> defer.Deferred:
        """The stored versions of ``targets``, read on this runner's link (``cache.batches.versions``)."""
        return read_versions(self._link, self._clock, targets, max_size, budget, judge)

    def _budget_gets(self, results: List[OperationResult], budget: int, minimal: bool) -> defer.Deferred:
        """Each admitted get's cap on the bytes it may read, by ``id`` of its result (none: no cap needed).

        Gets past the budget get their ``OverBudget`` here, and are not read.
        """
        gets = [result for result in results if result.operation.op == GET]
        written = (
            0 if minimal else sum(len(r.operation.body or b"") for r in results if r.operation.op in (PUT, CREATE))
        )
        if sum(result.operation.max_size for result in gets) + written <= budget:
            return defer.succeed({})
        owned = {(r.operation.collection, r.operation.doc_id): r.operation.owned for r in gets}
        targets = list(owned)
        if not any(owned.values()):
            measured = self._link.pipeline([(b"HSTRLEN", keys.document_key(*target), b"b") for target in targets])
        else:  # another's document measured as a missing one (0); -1, an index being built: its read fails
            commands = [_measure(target, owned[target]) for target in targets]
            measured = self._link.pipeline_scripts(commands, [scripts.OWNED_SIZE])
            measured.addCallback(lambda sizes: [max(size, 0) for size in sizes])
        return measured.addCallback(lambda sizes: admitted_gets(results, dict(zip(targets, sizes)), budget, minimal))

    def concern_of(self, operations: Sequence[Operation]) -> WriteConcern:
        """What the batch's writes wait for: the most replicas any of them asks for.

        The writes share a pipeline and one ``WAIT`` at its end, so the
        batch waits as its most careful write would alone (its collection's
        ``write_replicas``, else the deployment's); the others wait with it.
        """
        asked = [
            self._concern.replicas if operation.replicas is None else operation.replicas
            for operation in operations
            if operation.op in WRITES
        ]
        replicas = max(asked, default=self._concern.replicas)
        return self._concern if replicas == self._concern.replicas else WriteConcern(replicas, self._concern.timeout)

    @defer.inlineCallbacks
    def _run_segment(
        self,
        batch: List[OperationResult],
        start: int,
        end: int,
        concern: WriteConcern,
        fresh: bool,
        caps: Dict[int, int],
        reads: PatchReads,
    ) -> Any:
        """Runs ``batch[start:end]``, or the first part of it that its patches' documents fit; fires with its end."""
        window = batch[start:end]
        bases, cut = yield self._read_bases([result for result in window if result.operation.op == PATCH], reads)
        if cut is not None:
            end = start + next(index for index, result in enumerate(window) if result is cut)
        results = batch[start:end]
        plan = SegmentPlan(self._spans_slots)
        # A patch merges a document of up to JETWAY_MAX_BODY: in slices (cache.turns), and a large one alone.
        yield in_turns(
            self._clock,
            results,
            lambda result: self._plan(plan, result, bases, caps, fresh),
            pause_after=lambda result: _heavy(result, reads),
        )
        plan.close()
        if not plan.commands:
            self._forget(plan.written)  # patches found done by an earlier attempt
            return end
        wait = concern.wait_command() if concern.waits else None
        link = self._write_link if wait is not None else self._link
        assert link is not None
        outcomes = yield self._store.forgetting(
            link.pipeline_outcomes(plan.commands, _SCRIPTS, wait),
            [keys.document_key(*target) for target in plan.written],
        )
        for result, prepared, ok, reply in plan.settled(outcomes):
            _settle(result, prepared, ok, reply)
        for result, read in plan.sharing:
            result.document, result.error = read.document, read.error
        if wait is not None:
            _check_replicated(results, outcomes[-1], concern, self._concern.replicas)
        return end

    def _plan(
        self, plan: SegmentPlan, result: OperationResult, bases: Dict[int, Any], caps: Dict[int, int], fresh: bool
    ) -> None:
        """``result``'s operation into ``plan``: answered from the hot cache, shared with an earlier get, or sent."""
        target = (result.operation.collection, result.operation.doc_id)
        if result.error is not None:
            return  # a get past the budget
        if result.operation.op == GET and not fresh and target not in plan.written:
            result.document = self._store.cached(*target)
            if result.document is not None:
                owned = result.operation.owned
                if owned is not None and not owned.sees(result.document):
                    result.document, result.error = None, DocumentNotFound()  # another's: a missing one's
                return
        if result.operation.op == GET and target in plan.reading:
            plan.sharing.append((result, plan.reading[target]))
            return
        if result.operation.op == GET:
            plan.reading[target] = result
        elif result.operation.op in WRITES:
            plan.written.add(target)
            plan.reading.pop(target, None)
        prepared = self._prepare(result, bases.pop(id(result), None), caps.get(id(result)))
        if isinstance(prepared, tuple):
            plan.read(result, prepared, target)
        elif prepared is not None:
            plan.write(result, prepared, target)

    def _forget(self, written: Set[Tuple[bytes, bytes]]) -> None:
        for target in written:
            self._store.forget(*target)

    def _read_bases(self, patches: List[OperationResult], reads: PatchReads) -> defer.Deferred:
        """The stored fields of the patched documents that fit one segment, by ``id`` of their result.

        Fires with ``(bases, cut)``: ``cut`` is the first patch whose
        document did not come (over its cap, or past the segment's bytes):
        the segment ends before it. None: every patch has its document.
        """
        if not patches:
            return defer.succeed(({}, None))
        caps = reads.caps(patches)
        commands = [_read_within(r.operation, cap) for r, cap in zip(patches, caps)]
        reading = self._link.pipeline_outcomes(commands, [scripts.READ_ONE_WITHIN])
        return reading.addCallback(_bases_read, patches, len(caps), reads)

    def _prepare(self, result: OperationResult, base: Any, cap: Optional[int] = None) -> Any:
        """The command of ``result``'s operation (a tuple, or a prepared write); None if it is settled already.

        ``cap``: the most bytes a get may read (None: any).
        """
        operation = result.operation
        if operation.op == GET:
            if operation.owned is not None:
                return _read_owned(operation, operation.owned, _UNCAPPED if cap is None else cap)
            if cap is not None:
                return _read_within(operation, cap)
            return read_command(operation.collection, operation.doc_id)
        if operation.op == DELETE:
            return self._store.prepare_delete(operation.collection, operation.doc_id, operation.conditions.if_match)
        if operation.op == PATCH:
            return self._prepare_patch(result, base)
        conditions = Conditions(if_none_match=b"*") if operation.op == CREATE else operation.conditions
        assert operation.body is not None
        return self._store.prepare_put(
            operation.collection,
            operation.doc_id,
            operation.body,
            conditions,
            operation.ttl,
            operation.etag,
            operation.op.encode(),  # the change feed names a batch's write as it names the same write alone
            operation.indexed,
        )

    def _prepare_patch(self, result: OperationResult, base: Any) -> Optional[PreparedPut]:
        ok, fields = base
        if not ok:
            result.error = fields
            return None
        operation = result.operation
        body, etag, modified = fields
        try:
            if body is not None and operation.etag is not None and etag == operation.etag:
                result.document = Document(body, etag, modified)  # this patch, done by an earlier attempt
                return None
            if body is None:
                raise PreconditionFailed() if operation.conditions.if_match else DocumentNotFound()
            if_match = operation.conditions.if_match
            if if_match and not (if_match == b"*" or etag in if_match.split()):
                raise PreconditionFailed()
            value = merge_patch(codec.loads(body), operation.patch)
            merged = codec.dumps(value)
            if len(merged) > operation.max_size:
                raise DocumentTooLarge(len(merged))
            plan = operation.planner(value, len(merged)) if operation.planner is not None else KEPT
        except Exception as error:
            result.error = error
            return None
        cas = Conditions(if_match=etag)
        return self._store.prepare_put(
            operation.collection, operation.doc_id, merged, cas, plan.expiry, operation.etag, b"patch", plan.indexed
        )


def _bases_read(
    outcomes: List[Tuple[bool, Any]], patches: List[OperationResult], asked: int, reads: PatchReads
) -> Tuple[Dict[int, Any], Optional[OperationResult]]:
    """``_read_bases``' answer from the outcomes of the first ``asked`` patches' reads."""
    bases: Dict[int, Any] = {}
    for result, (ok, reply) in zip(patches, outcomes):
        if ok and not reads.learn(result, reply):
            if result is not patches[0] or not reads.first_missed(result):
                return bases, result  # read again in the next segment, its size known
            reply, ok = WriteConflict(), False  # it kept growing past what it measured
        bases[id(result)] = (ok, reply)
    return bases, patches[asked] if asked < len(patches) else None


def _read_within(operation: Operation, cap: int) -> Tuple[Any, ...]:
    """The read of ``operation``'s document through ``READ_ONE_WITHIN``: its fields, or its size if over ``cap``."""
    return scripts.READ_ONE_WITHIN.call([keys.document_key(operation.collection, operation.doc_id)], [cap])


def _owned_keys(target: Target) -> List[bytes]:
    """The keys of a bound get's scripts: its shard's index states, and its document."""
    collection, doc_id = target
    return [keys.index_states_key(collection, keys.shard_of(doc_id)), keys.document_key(collection, doc_id)]


def _read_owned(operation: Operation, owned: OwnedReads, cap: int) -> Tuple[Any, ...]:
    """A bound get's read (``READ_OWNED_ONE_WITHIN``): as ``_read_within``, another's document a missing one."""
    target = (operation.collection, operation.doc_id)
    return scripts.READ_OWNED_ONE_WITHIN.call(_owned_keys(target), [owned.index, owned.entry(operation.doc_id), cap])


def _measure(target: Target, owned: Optional[OwnedReads]) -> Tuple[Any, ...]:
    """A get's document's size before it is admitted; a bound get's by ``OWNED_SIZE`` (another's: 0)."""
    if owned is None:
        return (b"HSTRLEN", keys.document_key(*target), b"b")
    return scripts.OWNED_SIZE.call(_owned_keys(target), [owned.index, owned.entry(target[1])])


def _heavy(result: OperationResult, reads: PatchReads) -> bool:
    """Whether ``result`` is a patch of a large document: its merge takes a reactor turn of its own."""
    operation = result.operation
    return operation.op == PATCH and reads.sizes.get((operation.collection, operation.doc_id), 0) >= HEAVY_MERGE


def _check_replicated(
    results: List[OperationResult], waited: Tuple[bool, Any], concern: WriteConcern, default: int
) -> None:
    """Each write that fewer replicas confirmed than it asks for becomes ``NotReplicated`` (it did happen).

    A write asks for its collection's ``write_replicas``, else ``default``
    (the deployment's): one that asks for fewer than the ``WAIT`` got is
    answered as it would be alone.
    """
    ok, confirmed = waited
    reached = confirmed if ok else 0
    if reached >= concern.replicas:
        return
    for result in results:
        wanted = default if result.operation.replicas is None else result.operation.replicas
        if result.written and reached < wanted:
            etag = result.document.etag if result.document is not None else None
            result.error = NotReplicated(reached, wanted, concern.timeout, etag)


def _settle(result: OperationResult, prepared: Any, ok: bool, reply: Any) -> None:
    """Read an operation's reply into its result."""
    if not ok:
        result.error = reply
        return
    operation = result.operation
    try:
        if operation.op == GET and operation.owned is not None and reply == -1:
            raise not_built(operation.owned, 0, 1)  # its shard cannot tell whose the document is yet
        if operation.op == GET and isinstance(reply, int):
            raise OverBudget(
                reply,
                _cap_of(prepared),
                f"the document grew to {reply} bytes while the batch ran, past this get's share"
                f" ({_cap_of(prepared)} bytes) of the batch's budget; retry",
            )
        if operation.op == GET and len(reply) == 3:  # read through READ_ONE_WITHIN: no variant fields
            result.document = None if reply[0] is None else Document(*reply)
            if result.document is None:
                raise DocumentNotFound()
        elif operation.op == GET:
            result.document = stored_document(reply)
            if result.document is None:
                raise DocumentNotFound()
        elif isinstance(prepared, PreparedDelete):
            delete_outcome(reply)
            result.written = True
        else:
            result.document, result.created = put_outcome(prepared, reply)
            result.written = result.created is not None
    except PreconditionFailed as error:
        # A patch's compare-and-set lost to a writer outside the batch.
        result.error = WriteConflict() if operation.op == PATCH else error
    except Exception as error:
        result.error = error


def _cap_of(command: Tuple[Any, ...]) -> int:
    """The cap a ``READ_ONE_WITHIN`` call was given (its last argument)."""
    return int(command[-1])
