"""A whole collection read in id order, page after page, for the NDJSON export (``handlers.exports``).

Each index shard lists its ids (``cache.keys``); a page is the next ids of
the sixteen, in order. ``DocumentPages.page`` asks every shard for ``limit``
+ 1 ids each time, since any one shard may hold all of the next ``limit``;
a scan reads the ids ahead instead, and keeps what a page did not take:

- a range asks each shard for its share of a page twice over, and ends at
  the smallest last id of the shards that answered in full (below it no id
  was left out: those shards answered every id up to it, the others all
  they had). Ids are spread over the shards by a hash, so a range is most
  of two pages' worth, and each starts where the last ended;
- a page takes the first ``limit`` ids known, and reads their bodies within
  the byte budget (``bounded_reads``, cut where the budget ends); the ids
  it had no room for stay first in line for the next page;
- as a page's bodies are asked for, the next range is asked for with them
  when fewer than a page of ids would be left: when the next page's turn
  comes its ids are known, so its bodies are asked for at once, and Redis
  reads them while the worker writes this page (one round trip a page).

A document created during the scan with an id the scan has passed is not
in it; one deleted before its body is read is left out, and its index entry
pruned, as a list page does.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Callable, List, Optional, Tuple

from twisted.internet import defer
from twisted.python.failure import Failure

from cache import keys
from cache.documents import bounded_reads
from cache.documents.document import Page
from cache.redis.link import Link

# Ids asked of each shard at least, however small the page.
MIN_PER_SHARD = 16
# Drops the index entries of a collection's documents found gone (DocumentPages' pruning, in the background).
Prune = Callable[[bytes, List[bytes]], None]


def in_id_order(shards: List[List[bytes]]) -> List[bytes]:
    """The shards' ids (each shard's in order, none in two) in one order: one sort of the runs, where
    ``heapq.merge``'s generators cost PyPy several times more (docs/performance.md, "Import and export")."""
    return sorted(itertools.chain.from_iterable(shards))


def shard_ranges(link: Link, collection: bytes, after: Optional[bytes], per_shard: int) -> defer.Deferred:
    """Each index shard's next ``per_shard`` ids after the id ``after`` (from the first, without it), in one
    pipeline: a list of the shards' lists, each in order."""
    start = b"(" + after if after else b"-"
    return link.pipeline(
        [
            (b"ZRANGEBYLEX", keys.index_key(collection, shard), start, b"+", b"LIMIT", 0, per_shard)
            for shard in range(keys.INDEX_SHARDS)
        ]
    )


def page_of(collection: bytes, ids: List[bytes], bodies: List[Any], last_id: Optional[bytes], prune: Prune) -> Page:
    """The bodies read for the first ids of ``ids`` as a page: a document gone meanwhile (None) left out, and its
    index entry pruned."""
    stale = [doc_id for doc_id, body in zip(ids, bodies) if body is None]
    if stale:
        prune(collection, stale)
    kept = [doc_id for doc_id, body in zip(ids, bodies) if body is not None]
    return Page([body for body in bodies if body is not None], last_id, kept)


class CollectionScan:
    """One reader's pass over a collection, from after the id ``after``, one ``next_page`` at a time."""

    def __init__(
        self,
        link: Link,
        collection: bytes,
        after: Optional[bytes],
        budget: int,
        prune: Prune,
    ) -> None:
        self._link = link
        self._collection = collection
        self._budget = budget
        self._prune = prune
        self._known: List[bytes] = []  # ids read, in order, in no page yet
        self._through = after  # ranges start after it: every id before it is known or paged
        self._ended = False  # a range reached the collection's last id
        self._ranging: Optional[defer.Deferred] = None
        self._failed: Optional[Failure] = None  # a range that failed, for the next page to raise

    def next_page(self, limit: int) -> defer.Deferred:
        """The next ``Page`` of at most ``limit`` documents; its ``last_id`` is None once the collection is done."""
        if self._failed is not None:
            return defer.fail(self._failed)
        if self._ranging is not None and len(self._known) < limit:
            return self._ranging.addCallback(lambda _: self.next_page(limit))
        if not self._known and not self._ended:
            self._range(limit)
            return self.next_page(limit)
        return self._read(limit)

    def _range(self, limit: int) -> None:
        per_shard = max(2 * limit // keys.INDEX_SHARDS, MIN_PER_SHARD)
        ranging = shard_ranges(self._link, self._collection, self._through, per_shard)
        self._ranging = ranging
        ranging.addCallbacks(self._ranged, self._range_failed, callbackArgs=(per_shard,))

    def _ranged(self, shards: List[List[bytes]], per_shard: int) -> None:
        self._ranging = None
        ids = in_id_order(shards)
        full = [shard_ids[-1] for shard_ids in shards if len(shard_ids) == per_shard]
        if full:
            bound = min(full)
            del ids[bisect.bisect_right(ids, bound) :]
            self._through = bound
        else:
            self._ended = True
        self._known += ids

    def _range_failed(self, failure: Failure) -> None:
        self._ranging = None
        self._failed = failure

    def _read(self, limit: int) -> defer.Deferred:
        taken = self._known[:limit]
        if not self._ended and self._ranging is None and len(self._known) - len(taken) < limit:
            self._range(limit)  # the next page's ids, asked for with this page's bodies
        if not taken:
            return defer.succeed(Page([], None, []))
        read = bounded_reads.read_within(self._link, self._collection, taken, [1] * len(taken), self._budget, cut=True)
        return read.addCallback(self._page_of, taken)

    def _page_of(self, read: Tuple[List[Any], int], taken: List[bytes]) -> Page:
        bodies, covered = read
        del self._known[:covered]  # what the budget left out is the next page's first
        done = self._ended and not self._known
        return page_of(self._collection, taken, bodies, None if done else taken[covered - 1], self._prune)
