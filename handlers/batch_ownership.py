"""A batch under owner rules: each operation of a bound caller (``handlers.ownership``) as its single request.

Only for the collections whose rule binds the caller (``owners_of``; for
everyone else it is empty and nothing here runs), in four steps of
``handlers.batch``:

- a put's or create's document is made its writer's before it is planned
  (``owned_write``: the owner member filled in, or the operation's own 422
  or 403);
- before the batch runs, the documents its puts, patches and deletes name
  are read at once (``cache.batches.versions``: one round trip, within a
  segment's bytes), and each write is judged against its document as read
  and pinned to it (``pin_writes``): another's document is a put's 403, a
  patch's or a delete's 404; the operation's own conditions are judged
  (412), then it is sent with ``if_match`` that ETag (or ``if_none_match``
  ``*``), so a write by someone else in between is a 412, never an
  overwrite; a patch that would change the owner member is a 403;
- a get reads only the caller's document (``owned_gets``: the rule's
  ``OwnedReads``, applied by the runner): another's is measured, read and
  counted as a missing one, so it spends none of the answer's byte budget
  and its result is a missing one's 404, whatever its size;
- after it ran, a patch whose document another writer changed since its
  owner was checked is a 412, as a single PATCH's (``judged``).

Operations of one batch on one document are judged in order: a later one
against what an earlier one leaves (its planned ETag, or no document after
a delete), and pinned to any of the caller's own versions it may find (the
earlier one's, or the one before it should that one fail at run time: a
refused patch leaves the document as read). A version no one of them left
is someone else's write: a 412, never an overwrite.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from twisted.internet import defer

from cache.batches.batch import CREATE, DELETE, GET, PATCH, PUT, BatchRunner, Operation, OperationResult
from cache.batches.versions import Found, Target, Version
from cache.collection_settings import CollectionSettings
from cache.documents.document import Conditions, Document
from cache.errors import DocumentNotFound, PreconditionFailed, WriteConflict
from handlers.base import as_api_error
from handlers.http.auth import Grant
from handlers.http.errors import ApiError
from handlers.ownership import bound_owner, keeping_owner, owned_document, owned_reads, pinned, visible

# The collections whose owner rule binds the caller: each one's settings and the owner it acts as.
Owners = Dict[bytes, Tuple[CollectionSettings, str]]
Checked = Union[Operation, ApiError]
_PINNED = frozenset({PUT, PATCH, DELETE})
_GETS = frozenset({GET})


def owners_of(grant: Optional[Grant], rules: Dict[bytes, CollectionSettings]) -> Owners:
    """The collections of ``rules`` whose owner rule binds ``grant``'s caller (empty: no rule applies)."""
    owners: Owners = {}
    for name, settings in rules.items():
        owner = bound_owner(grant, settings)
        if owner is not None:
            owners[name] = (settings, owner)
    return owners


def owned_write(owners: Owners, item: Checked, value: Any, ids: Any) -> Tuple[Checked, Any, Any]:
    """A put's or create's document as its writer's (``owned_document``), or that operation's problem."""
    if not isinstance(item, Operation) or item.op not in (PUT, CREATE) or item.collection not in owners:
        return item, value, ids
    settings, owner = owners[item.collection]
    assert settings.owner is not None and item.body is not None
    try:
        value, body = owned_document(settings.owner, owner, value, item.body)
    except ApiError as error:
        return error, None, ids
    return (item if body is item.body else replace(item, body=body)), value, ids


@defer.inlineCallbacks
def pin_writes(batches: BatchRunner, ready: List[Checked], owners: Owners, max_size: int, budget: int) -> Any:
    """``ready`` with each bound put, patch and delete judged against its document as stored, and pinned."""
    targets = [(item.collection, item.doc_id) for item in ready if _bound(item, owners, _PINNED)]
    if not targets:
        return ready

    def judge(target: Target, body: bytes) -> bool:
        settings, owner = owners[target[0]]
        assert settings.owner is not None
        return visible(settings.owner, owner, body)

    state: Dict[Target, Found] = yield batches.versions(targets, max_size, budget, judge)
    earlier: Dict[Target, List[bytes]] = {}
    return [_pinned(item, owners, state, earlier) if _bound(item, owners, _PINNED) else item for item in ready]


def owned_gets(ready: List[Checked], owners: Owners) -> List[Checked]:
    """``ready`` with each bound get reading only its caller's documents: another's is a missing one before the
    batch's byte budget counts anything (``owned_reads``), as in a multi-get."""
    reads = {name: owned_reads(settings, owner) for name, (settings, owner) in owners.items()}
    return [replace(item, owned=reads[item.collection]) if _bound(item, owners, _GETS) else item for item in ready]


def judged(results: Iterable[OperationResult], owners: Owners) -> Iterator[OperationResult]:
    """The run's results, each bound patch that lost its document to another writer a 412, as each is rendered."""
    for result in results:
        operation = result.operation
        if operation.op == PATCH and operation.collection in owners and isinstance(result.error, WriteConflict):
            # Its document changed since its owner was checked: a single PATCH's 412 (it re-reads, pinned).
            result.error = PreconditionFailed()
        yield result


def _bound(item: Checked, owners: Owners, ops: frozenset) -> bool:
    return isinstance(item, Operation) and item.op in ops and item.collection in owners


def _pinned(item: Checked, owners: Owners, state: Dict[Target, Found], earlier: Dict[Target, List[bytes]]) -> Checked:
    """``item`` pinned to its document as ``state`` has it (then what it leaves), or its problem.

    ``earlier``: the ETags of the caller's own versions that earlier operations of the batch leave behind them
    (should those fail at run time, the document is still one of those), which a pin accepts too.
    """
    assert isinstance(item, Operation)
    settings, owner = owners[item.collection]
    target = (item.collection, item.doc_id)
    try:
        found = state[target]
        if isinstance(found, BaseException):
            raise found
        operation = _pin(item, settings, owner, found, earlier.get(target, []))
    except Exception as error:
        problem = as_api_error(error)
        if problem is None:
            raise
        return problem
    assert item.etag is not None
    if item.op == DELETE:
        state[target] = None
        earlier.pop(target, None)
    else:
        state[target] = Version(True, item.etag, b"")
        if found is not None:
            earlier.setdefault(target, []).append(found.etag)
    return operation


def _pin(
    item: Operation, settings: CollectionSettings, owner: str, found: Optional[Version], earlier: List[bytes]
) -> Operation:
    current = None if found is None else Document(b"", found.etag, found.last_modified)
    if item.op == PUT:
        if found is not None and not found.verdict:
            raise ApiError(403, "forbidden", "this document belongs to another owner")
        conditions = pinned(item.conditions, current)
        if conditions.if_match and earlier:
            conditions = Conditions(b" ".join([conditions.if_match, *earlier]))
        return replace(item, conditions=conditions)
    if found is None or not found.verdict:
        raise DocumentNotFound()  # another's is a missing one
    if_match = b" ".join([pinned(Conditions(item.conditions.if_match, b""), current).if_match, *earlier])
    if item.op == DELETE:
        return replace(item, conditions=Conditions(if_match=if_match))
    assert item.planner is not None
    return replace(item, conditions=Conditions(if_match=if_match), planner=keeping_owner(settings, owner, item.planner))
