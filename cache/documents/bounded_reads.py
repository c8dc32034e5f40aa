"""Reads of many documents within a byte budget, sizes known before any body leaves Redis.

A multi-get or a list page is put together from stored bodies, and its
size is the sum of theirs (an id asked twice counted twice): a request
line asking 300 times for a 1 MiB document asked for 300 MiB
(docs/limits.md, "Measured").
Here each distinct document is read once, by ``scripts.READ_WITHIN``: one
script per index shard (its documents share a hash slot, so the same call
runs on Redis Cluster), which measures the bodies (``HSTRLEN``) and sends
them only when they fit the shard's allowance, else only their sizes. The
allowances add up to the budget, so neither Redis's replies nor the worker
ever hold more than it, whatever is stored.

Round trips: the shards' scripts go in one pipeline (one round trip, split
by node on a cluster). The budget is shared between the shards by the
number of ids each was asked; when a shard's share was too small but the
whole fits, a second round fetches what is missing with the bytes left (a
document may grow between the rounds, hence a few rounds at most, then
``WriteConflict``: the documents kept changing size while read). What does
not fit raises ``OverBudget`` before any of it is sent, or, for a page
(``cut``), ends the page early: the longest run of ids, in order, that fits.

A reader bound by an owner rule reads through ``scripts.READ_OWNED_WITHIN``
(``owned``: ``cache.ownership.OwnedReads``): a document whose owner entry is
not the reader's is measured, counted and sent as a missing one, in every
round, so the answer (a 413's sizes too) is the one missing ids would get.
Everyone else's reads are the plain script's, as they were.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache import keys
from cache.documents import scripts
from cache.errors import StoreError, WriteConflict
from cache.indexes.queries import IndexNotReady
from cache.ownership import OwnedReads
from cache.redis.link import Link

# What one answer composed from stored documents may carry (JETWAY_MAX_RESPONSE_BYTES).
DEFAULT_BUDGET = 16 * 1024 * 1024
# Rounds of one read: the first, and a few for documents that grew meanwhile.
MAX_ROUNDS = 4


class OverBudget(StoreError):
    """The documents asked for add up to more bytes than one answer may carry."""

    def __init__(self, size: int, budget: int, detail: str = "") -> None:
        super().__init__(
            detail
            or f"the documents asked for add up to {size} bytes; one answer carries at most {budget}"
            " (JETWAY_MAX_RESPONSE_BYTES): ask for fewer documents, or page through the collection"
        )
        self.size = size
        self.budget = budget


def not_built(owned: OwnedReads, built: int, shards: int) -> IndexNotReady:
    """What a bound read answers when ``shards`` - ``built`` of the shards it read are building the owner
    rule's index (the rule just declared): a 409 until they are built, as a bound page's (``handlers.collections``)."""
    return IndexNotReady(owned.index.split(b":")[0].decode(), built, shards)


def read_within(
    link: Link,
    collection: bytes,
    doc_ids: Sequence[bytes],
    counts: Sequence[int],
    budget: int,
    cut: bool = False,
    owned: Optional[OwnedReads] = None,
) -> defer.Deferred:
    """The bodies of the distinct ``doc_ids`` (None where missing), each counted ``counts[i]`` times.

    Fires with ``(bodies, covered)``: without ``cut`` every id is covered or
    ``OverBudget`` is raised; with ``cut`` the first ``covered`` ids are
    (always at least one: a document larger than the budget on its own,
    stored before ``JETWAY_MAX_BODY`` was lowered, still gets a page).
    ``owned``: only the owner's documents are read, others are missing ones
    (``IndexNotReady`` while the owner rule's index is built).
    """
    if not doc_ids:
        return defer.succeed(([], 0))
    return _BoundedRead(link, collection, doc_ids, counts, budget, cut, owned).first_round()


class _BoundedRead:
    """The state of one read across its rounds (plain callbacks: no generator frame keeps bodies)."""

    def __init__(
        self,
        link: Link,
        collection: bytes,
        doc_ids: Sequence[bytes],
        counts: Sequence[int],
        budget: int,
        cut: bool,
        owned: Optional[OwnedReads] = None,
    ) -> None:
        self.link = link
        self.collection = collection
        self.owned = owned
        self.entries = [owned.entry(doc_id) for doc_id in doc_ids] if owned is not None else []
        self.doc_keys = [keys.document_key(collection, doc_id) for doc_id in doc_ids]
        self.shards = [keys.shard_of(doc_id) for doc_id in doc_ids]
        self.counts = counts
        self.budget = budget
        self.cut = cut
        self.covered = len(doc_ids)
        self.sizes = [0] * len(doc_ids)
        self.bodies: List[Optional[bytes]] = [None] * len(doc_ids)
        self.fetched = [False] * len(doc_ids)

    def first_round(self) -> defer.Deferred:
        """The budget shared between the shards by the number of ids asked in each."""
        return self._round(_first_shares(self.shards, self.counts, self.budget), 1)

    def _round(self, groups: List[Tuple[List[int], int]], number: int) -> defer.Deferred:
        """One script per shard (its indexes and allowance), all in one pipeline."""
        if self.owned is not None:
            commands = [self._owned_read(indexes, allowance, self.owned) for indexes, allowance in groups]
            return self.link.pipeline_scripts(commands, [scripts.READ_OWNED_WITHIN]).addCallback(
                self._replied, groups, number
            )
        commands = [
            scripts.READ_WITHIN.call(
                [self.doc_keys[i] for i in indexes], [allowance, *(self.counts[i] for i in indexes)]
            )
            for indexes, allowance in groups
        ]
        sent = self.link.pipeline_scripts(commands, [scripts.READ_WITHIN])
        return sent.addCallback(self._replied, groups, number)

    def _owned_read(self, indexes: List[int], allowance: int, owned: OwnedReads) -> Tuple[Any, ...]:
        """One shard's ``READ_OWNED_WITHIN``: its index states, its documents, and the entries that are the owner's."""
        args: List[Any] = [allowance, owned.index]
        for i in indexes:
            args += (self.counts[i], self.entries[i])
        states = keys.index_states_key(self.collection, self.shards[indexes[0]])
        return scripts.READ_OWNED_WITHIN.call([states, *(self.doc_keys[i] for i in indexes)], args)

    def _replied(self, replies: List[Any], groups: List[Tuple[List[int], int]], number: int) -> Any:
        if self.owned is not None:
            unready = sum(reply == -1 for reply in replies)
            if unready:  # a shard cannot tell whose its documents are yet: no answer, rather than a wrong one
                raise not_built(self.owned, len(replies) - unready, len(replies))
        for (indexes, _), reply in zip(groups, replies):
            self._take(indexes, reply)
        limit = self.budget
        if self.cut:
            self.covered = self._fitting_run()
            # A document larger than the budget on its own (stored under a larger JETWAY_MAX_BODY) still pages.
            limit = max(limit, self._counted(0))
        wanted = [i for i in range(self.covered) if not self.fetched[i]]
        if not wanted:
            return self.bodies[: self.covered], self.covered
        spent = sum(self._counted(i) for i in range(self.covered))
        if spent > limit:
            raise OverBudget(spent, self.budget)
        if number == MAX_ROUNDS:
            raise WriteConflict()
        return self._round(_later_shares(self.shards, wanted, self._counted, limit - spent), number + 1)

    def _take(self, indexes: List[int], reply: List[Any]) -> None:
        """One shard's reply: its sizes, and its bodies if it sent them."""
        sizes = reply[1 : len(indexes) + 1]
        for i, size in zip(indexes, sizes):
            self.sizes[i] = size
        if not reply[0]:
            return
        blob = reply[-1]  # sliced into bytes: PyPy joins bytes into an answer far faster than memoryviews
        offset = 0
        for i, size in zip(indexes, sizes):
            self.fetched[i] = True
            if size:
                self.bodies[i] = blob[offset : offset + size]
                offset += size

    def _counted(self, i: int) -> int:
        return self.sizes[i] * self.counts[i]

    def _fitting_run(self) -> int:
        """How many ids, from the first, fit the budget together (at least one)."""
        total = 0
        for i in range(len(self.sizes)):
            total += self._counted(i)
            if total > self.budget:
                return max(i, 1)
        return len(self.sizes)


def _grouped(shards: List[int], indexes: Iterable[int]) -> List[List[int]]:
    """``indexes`` grouped by the shard of their id (one script per shard: one hash slot)."""
    groups: Dict[int, List[int]] = defaultdict(list)
    for i in indexes:
        groups[shards[i]].append(i)
    return list(groups.values())


def _first_shares(shards: List[int], counts: Sequence[int], budget: int) -> List[Tuple[List[int], int]]:
    """No size known yet: the budget shared by the number of times each shard's ids are asked."""
    asked = sum(counts)
    return [
        (members, budget * sum(counts[i] for i in members) // asked) for members in _grouped(shards, range(len(shards)))
    ]


def _later_shares(
    shards: List[int], wanted: List[int], counted: Callable[[int], int], spare: int
) -> List[Tuple[List[int], int]]:
    """Each shard what its wanted ids measured, and the bytes to spare shared by the number of them."""
    return [
        (members, sum(counted(i) for i in members) + spare * len(members) // len(wanted))
        for members in _grouped(shards, wanted)
    ]
