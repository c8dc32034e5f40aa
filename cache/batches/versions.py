"""The stored versions a batch's pinned writes are judged against: read before the batch runs, within bytes.

A caller bound by an owner rule (``handlers.batch_ownership``) writes only
its own documents, each write pinned to the version whose owner was
checked. Before such a batch runs, the documents its writes name are read
in one pipeline (one round trip), each through ``scripts.READ_ONE_WITHIN``
with a cap, the caps adding up to a segment's bytes as a segment's patches
do (``cache.batches.segments.PatchReads``, the same caps): a document over
its cap answers its size and is read in a later round, its size known, so
small documents are one round trip and no round holds more than a
segment's bytes. Of each document only what ``judge`` makes of its body is
kept, with its ETag and Last-Modified: the bodies go as each round is
judged. A document that keeps outgrowing its cap is a ``WriteConflict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from twisted.internet import defer

from cache import keys
from cache.batches.operations import Operation, OperationResult
from cache.batches.segments import PatchReads, segment_bytes
from cache.documents import scripts
from cache.errors import WriteConflict
from cache.redis.link import Link
from cache.turns import in_turns

Target = Tuple[bytes, bytes]
# What a judge makes of a stored document's body (an owner check's verdict).
Judge = Callable[[Target, bytes], Any]


@dataclass(frozen=True)
class Version:
    """A stored document as a pinned write needs it: the verdict on its body, its ETag and Last-Modified."""

    verdict: Any
    etag: bytes
    last_modified: bytes


# A target's version: None when there is no document, an exception when it could not be read.
Found = Union[None, Version, BaseException]


@defer.inlineCallbacks
def read_versions(link: Link, clock: Any, targets: Sequence[Target], max_size: int, budget: int, judge: Judge) -> Any:
    """Fires with each of ``targets``' ``Found``, by target.

    ``max_size``: the largest document expected (``JETWAY_MAX_BODY``), which
    the first read of a round may always bring; ``budget``: the answer's
    (``segment_bytes`` of it bounds a round). A round's bodies are judged in
    slices (``cache.turns``): judging a segment's bytes is parsing them.
    """
    reads = PatchReads(segment_bytes(budget))
    left = [OperationResult(Operation("get", *target, max_size=max_size)) for target in dict.fromkeys(targets)]
    found: Dict[Target, Found] = {}

    def settle(each: Tuple[OperationResult, Tuple[bool, Any]]) -> Optional[OperationResult]:
        """``found`` for one read; the read itself when it is to be read again, its size known."""
        result, (ok, reply) = each
        target = (result.operation.collection, result.operation.doc_id)
        if not ok:
            found[target] = reply
        elif reads.learn(result, reply):
            found[target] = _version(target, reply, judge)
        elif result is not left[0] or not reads.first_missed(result):
            return result
        else:
            found[target] = WriteConflict()  # it kept growing past what it measured
        return None

    while left:
        caps = reads.caps(left)
        commands = [_read_within(result.operation, cap) for result, cap in zip(left, caps)]
        outcomes = yield link.pipeline_outcomes(commands, [scripts.READ_ONE_WITHIN])
        missed = yield in_turns(clock, zip(left, outcomes), settle)
        left = [result for result in missed if result is not None] + left[len(caps) :]
    return found


def _version(target: Target, fields: List[Optional[bytes]], judge: Judge) -> Optional[Version]:
    body, etag, modified = fields[:3]
    if body is None or etag is None or modified is None:
        return None
    return Version(judge(target, body), etag, modified)


def _read_within(operation: Operation, cap: int) -> Tuple[Any, ...]:
    return scripts.READ_ONE_WITHIN.call([keys.document_key(operation.collection, operation.doc_id)], [cap])
