"""Where a batch's pipelines end: runs of operations, and the bytes a run's patches may read and write.

A merge patch reads its document, merges into it, and writes it back: a
segment (one pipeline of reads, one of writes, ``cache.batches.batch``) holds
every document its patches merge, twice (the bases read, the merged
documents encoded into one write). A segment is therefore bounded by
bytes, not by a count: ``SEGMENT_BYTES`` (or the answer's budget, if
smaller) of documents read, the sizes of the documents as they are.

The sizes come with the reads, with no round trip of their own: each
patch reads its document through ``scripts.READ_ONE_WITHIN`` with a cap,
and a document over its cap answers its size instead of its fields. The
caps of one read add up to the segment's bytes: a document whose size is
known is capped at that size (and a little room to grow), one not yet
known at an equal share of the rest of the segment (3 MiB over 99 patches:
31 KiB each, so 100 patches of small documents are one segment, one read).
The segment ends before the first patch whose document answered its size;
the next segment starts there, the sizes now known. The first patch of a
segment may always read a whole document (``JETWAY_MAX_BODY``), so every
segment makes progress; 1 MiB documents go 3 to a segment at the defaults.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Set, Tuple

from cache.batches.operations import PATCH, WRITES, Operation, OperationResult

# The documents one segment's patches read at most (and so, about, write):
# encoding them into one pipeline is a few ms of one reactor turn; 16 MiB
# (budget / JETWAY_MAX_BODY documents) held the worker far past /healthz's
# bound under load (issue #44; docs/limits.md, "A batch of 1,000 patches of
# 1 MiB documents").
SEGMENT_BYTES = 4 * 1024 * 1024
# A known size is capped with this much room: a document that grew more answers its size again (read later).
GROWTH = 256
# Times the first patch of a segment may find its document larger than its cap before it is a conflict.
MAX_FIRST_READS = 4

Target = Tuple[bytes, bytes]


def segments(operations: Sequence[Operation]) -> List[Tuple[int, int]]:
    """Runs of operations that can go in one pipeline, as far as their order goes.

    A patch of a document written earlier in the run starts a new one: it
    must merge into what that write left. ``PatchReads`` may end a run
    earlier, by bytes.
    """
    bounds: List[Tuple[int, int]] = []
    start = 0
    written: Set[Target] = set()
    for index, operation in enumerate(operations):
        target = (operation.collection, operation.doc_id)
        if operation.op == PATCH and target in written:
            bounds.append((start, index))
            start, written = index, set()
        if operation.op in WRITES:
            written.add(target)
    bounds.append((start, len(operations)))
    return [bound for bound in bounds if bound[0] < bound[1]]


class PatchReads:
    """The sizes of patched documents as reads learn them, and the caps of the next segment's reads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sizes: Dict[Target, int] = {}
        self._first_reads: Dict[int, int] = {}

    def caps(self, patches: Sequence[OperationResult]) -> List[int]:
        """The caps of the first patches of ``patches`` that fit the segment (at least the first one)."""
        first = patches[0].operation if patches else None
        room = self.limit - (first.max_size if first is not None else 0)
        share = max(room // max(len(patches) - 1, 1), 1)  # the first patch's room apart
        caps: List[int] = []
        total = 0
        for result in patches:
            operation = result.operation
            known = self.sizes.get((operation.collection, operation.doc_id))
            if not caps:
                cap = max(operation.max_size, known or 0)
            else:
                cap = share if known is None else known + GROWTH
                if total + cap > self.limit:
                    break
            caps.append(cap)
            total += cap
        return caps

    def learn(self, result: OperationResult, reply: object) -> bool:
        """Whether ``reply`` (a ``READ_ONE_WITHIN`` outcome's value) brought the document; its size is kept."""
        target = (result.operation.collection, result.operation.doc_id)
        if isinstance(reply, int):
            self.sizes[target] = reply
            return False
        if isinstance(reply, list) and reply and isinstance(reply[0], bytes):
            self.sizes[target] = len(reply[0])
        return True

    def first_missed(self, result: OperationResult) -> bool:
        """The first patch of a segment found its document over its cap once more; True: give up (a conflict)."""
        misses = self._first_reads.get(id(result), 0) + 1
        self._first_reads[id(result)] = misses
        return misses >= MAX_FIRST_READS


def segment_bytes(budget: int) -> int:
    """The bytes one segment's patches read: ``SEGMENT_BYTES``, or the answer's budget if smaller."""
    return min(SEGMENT_BYTES, budget)
