"""A batch segment's plan: its writes gathered into one script call per slot group, not one call each.

Redis spends a few µs on every script call before the script does
anything (the command's parsing and dispatch, the Lua call, the reply); a
batch of 100 puts sent as 100 ``EVALSHA`` paid that 100 times. Here the
writes of a segment (``cache.batches.batch``) are gathered by slot into
``scripts.WRITE_MANY`` calls, each write still carried out by the very
Lua function of its single script (``scripts.PUT``, ``scripts.DELETE``:
its conditions, ETag, modified time, TTL, index entry and change-feed
event), and each answered on its own, in order.

Groups: a script's keys must share a slot on a cluster (``cache.keys``: a
collection's documents spread over ``INDEX_SHARDS`` slots), so there a
group is one slot; on one Redis, or a Sentinel's master, any keys may
meet in a script and a group is the whole segment. A group holds at most
``GROUP_WRITES`` writes and about ``GROUP_BYTES`` of documents, so a call
cannot hold Redis much longer than the pipeline of single calls did in
one go; a full group is sent as it is, and another starts.

Order: writes of one document always fall in one group, in order. A get
of a document an open group writes closes every open group first (their
calls go before the get), so the get sees what the earlier operations of
the batch wrote, as it did when each write was a call of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

from cache.batches.operations import OperationResult
from cache.documents import scripts
from cache.documents.document import PreparedDelete, PreparedPut
from cache.redis.errors import reply_error
from cache.redis.slots import key_slot

# Writes per WRITE_MANY call: 100 small puts hold Redis no longer than the pipeline of single calls did
# (docs/history/performance.md, "Batches at Redis's pace").
GROUP_WRITES = 100
# Documents' bytes per call: a group of large documents is cut sooner (Redis copies each into its hash).
GROUP_BYTES = 1 << 20

Target = Tuple[bytes, bytes]
Write = Any  # PreparedPut or PreparedDelete


@dataclass
class Group:
    """Writes of one slot (or of any, on one Redis) that go in one ``WRITE_MANY`` call."""

    members: List[Tuple[OperationResult, Write]] = field(default_factory=list)
    size: int = 0

    def command(self) -> Tuple[Any, ...]:
        keys: List[bytes] = []
        args: List[Any] = [len(self.members[0][1].keys)]
        for _, write in self.members:
            keys += write.keys
            args += (b"d" if isinstance(write, PreparedDelete) else b"p", len(write.args))
            args += write.args  # extended in place: a tuple of each write's arguments was a copy more
        return scripts.WRITE_MANY.call(keys, args)

    def outcomes(self, ok: bool, reply: Any) -> List[Tuple[bool, Any]]:
        """Each member's outcome: its own answer, or the call's error for all when the call itself failed."""
        if not ok:
            return [(False, reply)] * len(self.members)
        return [_outcome(answer) for answer in reply]


def _outcome(answer: Any) -> Tuple[bool, Any]:
    if isinstance(answer, list) and answer and answer[0] == b"err":
        return False, reply_error(answer[1].decode("utf-8", "replace"))
    return True, answer


@dataclass
class SegmentPlan:
    """The commands of one segment as they are planned, and what the planning must remember."""

    spans_slots: bool  # any keys may share a script (one Redis): one group for the segment
    commands: List[Any] = field(default_factory=list)
    # What each command answers: an operation with its prepared command, or a Group and None.
    sent: List[Tuple[Any, Any]] = field(default_factory=list)
    written: Set[Target] = field(default_factory=set)
    # The get that reads each document, while no write of it comes between: later gets share its read.
    reading: Dict[Target, OperationResult] = field(default_factory=dict)
    sharing: List[Tuple[OperationResult, OperationResult]] = field(default_factory=list)
    open: Dict[int, Group] = field(default_factory=dict)
    grouped: Set[Target] = field(default_factory=set)  # the documents the open groups write

    def write(self, result: OperationResult, write: Write, target: Target) -> None:
        """``write`` into its slot's open group; a group that is full is sent now."""
        slot = 0 if self.spans_slots else key_slot(write.keys[0])
        group = self.open.get(slot)
        if group is None:
            group = self.open[slot] = Group()
        group.members.append((result, write))
        group.size += len(write.document.body) if isinstance(write, PreparedPut) else 0
        self.grouped.add(target)
        if len(group.members) >= GROUP_WRITES or group.size >= GROUP_BYTES:
            del self.open[slot]
            self._send(group)

    def read(self, result: OperationResult, command: Any, target: Target) -> None:
        """A get's command, after the open groups when one of them writes its document."""
        if target in self.grouped:
            self.close()
        self.sent.append((result, command))
        self.commands.append(command)

    def close(self) -> None:
        """Send every open group, in the order they were opened."""
        for group in self.open.values():
            self._send(group)
        self.open.clear()
        self.grouped.clear()

    def _send(self, group: Group) -> None:
        if len(group.members) == 1:  # a write alone: its own script, as a single request sends it
            result, write = group.members[0]
            self.sent.append((result, write))
            self.commands.append(write.command())
            return
        self.sent.append((group, None))
        self.commands.append(group.command())

    def settled(self, outcomes: List[Tuple[bool, Any]]) -> List[Tuple[OperationResult, Any, bool, Any]]:
        """Each sent operation with its prepared command and its outcome, a group's members each on its own."""
        settled = []
        for (entry, prepared), outcome in zip(self.sent, outcomes):
            if isinstance(entry, Group):
                for (result, write), (ok, reply) in zip(entry.members, entry.outcomes(*outcome)):
                    settled.append((result, write, ok, reply))
            else:
                settled.append((entry, prepared, *outcome))
        return settled
