"""Reads of many documents: a page of a collection in id order, a multi-get (both within a byte budget), a count.

One of the parts ``cache.documents.store.DocumentStore`` is made of, given
the link it reads. The budget is kept by ``cache.documents.bounded_reads``,
which reads every body at most once.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache import keys
from cache.documents import bounded_reads, scripts
from cache.documents.document import Page
from cache.documents.scan import CollectionScan, in_id_order, page_of, shard_ranges
from cache.ownership import OwnedReads
from cache.redis.link import Link


class DocumentPages:
    """The reads of many documents of ``DocumentStore``: ``page`` and ``get_many``."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def page(
        self, collection: bytes, limit: int, after: Optional[bytes], budget: int = bounded_reads.DEFAULT_BUDGET
    ) -> defer.Deferred:
        """Up to ``limit`` bodies in id order, starting after the id ``after``; fewer when ``budget`` bytes are met."""
        # Plain callbacks, as the document reads: bodies bound to a generator
        # frame that waited for Redis would be kept by it
        # (docs/performance.md, "The read path: what made it faster").
        ranges = shard_ranges(self._link, collection, after, limit + 1)
        return ranges.addCallback(self._read_page, collection, limit, budget)

    def _read_page(self, shards: List[List[bytes]], collection: bytes, limit: int, budget: int) -> defer.Deferred:
        ids = in_id_order(shards)[: limit + 1]
        more = len(ids) > limit
        ids = ids[:limit]
        read = bounded_reads.read_within(self._link, collection, ids, [1] * len(ids), budget, cut=True)
        return read.addCallback(self._page_of, collection, ids, more)

    def _page_of(self, read: Tuple[List[Any], int], collection: bytes, ids: List[bytes], more: bool) -> Page:
        bodies, covered = read
        # A page the budget ended early continues after its last id, as a full one does.
        last_id = ids[covered - 1] if more or covered < len(ids) else None
        return page_of(collection, ids, bodies, last_id, self._prune)

    def scan(self, collection: bytes, after: Optional[bytes], budget: int) -> CollectionScan:
        """A pass over the whole collection after the id ``after``, a page at a time (the NDJSON export)."""
        return CollectionScan(self._link, collection, after, budget, self._prune)

    def count(self, collection: bytes) -> defer.Deferred:
        """How many documents the collection's index holds (expired ones not pruned yet included)."""
        cards = self._link.pipeline(
            [(b"ZCARD", keys.index_key(collection, shard)) for shard in range(keys.INDEX_SHARDS)]
        )
        return cards.addCallback(sum)

    def get_many(
        self,
        collection: bytes,
        doc_ids: Sequence[bytes],
        budget: int = bounded_reads.DEFAULT_BUDGET,
        owned: Optional[OwnedReads] = None,
    ) -> defer.Deferred:
        """The bodies of ``doc_ids`` in order, None where missing; ``OverBudget`` past ``budget`` bytes.

        Each distinct id is read once, and counted in the budget as many
        times as it is asked (the answer repeats it): ``cache.documents.bounded_reads``.
        ``owned``: a bound reader's, to whom another's document is a missing one, in the budget too.
        """
        if not doc_ids:
            return defer.succeed([])
        asked: Dict[bytes, int] = {}
        for doc_id in doc_ids:
            asked[doc_id] = asked.get(doc_id, 0) + 1
        distinct = list(asked)
        read = bounded_reads.read_within(self._link, collection, distinct, list(asked.values()), budget, owned=owned)
        return read.addCallback(_in_asked_order, distinct, doc_ids)

    def _prune(self, collection: bytes, stale_ids: List[bytes]) -> None:
        """Drop index entries of expired documents, in the background."""
        by_shard: Dict[int, List[bytes]] = {}
        for doc_id in stale_ids:
            by_shard.setdefault(keys.shard_of(doc_id), []).append(doc_id)
        for shard, ids in by_shard.items():
            doc_keys = [keys.document_key(collection, doc_id) for doc_id in ids]
            pruning = self._link.run_script(scripts.PRUNE, [keys.index_key(collection, shard), *doc_keys], ids)
            # A failed prune only leaves a stale entry that the next page skips.
            pruning.addErrback(lambda _: None)


def _in_asked_order(read: Tuple[List[Any], int], distinct: List[bytes], doc_ids: Sequence[bytes]) -> List[Any]:
    by_id = dict(zip(distinct, read[0]))
    return [by_id[doc_id] for doc_id in doc_ids]
