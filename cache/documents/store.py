"""Documents in Redis as the JSON bytes that are sent, read back as bytes.

The key layout is described in ``cache.keys``; every write goes through one
Lua script (``cache.documents.scripts``) so a body, its ETag, its modification time and
its index entry change together. Nothing here parses a stored body except a
merge patch, which has to.

``DocumentStore`` is made of three parts, each an object given what it
needs (the link, the hot cache, the write concern...) and holding its own
state: the reads of one document (``cache.documents.reads``), of many
(``cache.documents.pages``) and the writes (``cache.documents.writes``).
The values they take and give are in ``cache.documents.document`` and are
named here too, for the store's callers.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from twisted.internet import defer

from cache.documents.document import (
    NO_CONDITIONS,
    Conditions,
    Created,
    Document,
    Page,
    PreparedDelete,
    PreparedPut,
    delete_outcome,
    put_outcome,
    read_command,
    stored_document,
)
from cache.documents.pages import DocumentPages
from cache.documents.reads import DocumentReads
from cache.documents.variants import DEFAULT_VARIANTS, Variants
from cache.documents.write_concern import PRIMARY_ONLY, WriteConcern
from cache.documents.writes import DocumentWrites
from cache.feed.streams import NO_FEED, FeedLog
from cache.hot.cache import HotCache
from cache.indexes import counts as index_counts
from cache.indexes import queries as index_queries
from cache.indexes import reads as index_reads
from cache.indexes.builds import IndexBuilds
from cache.redis.link import Link

__all__ = [
    "NO_CONDITIONS",
    "Conditions",
    "Created",
    "Document",
    "DocumentStore",
    "Page",
    "PreparedDelete",
    "PreparedPut",
    "delete_outcome",
    "put_outcome",
    "read_command",
    "stored_document",
]


class DocumentStore:
    """The document operations of the API, on a ``Link`` (one Redis, Sentinel or Cluster).

    With a ``write_concern`` that waits for replicas, writes go through
    ``write_link`` (a pool of their own: ``WAIT`` blocks its connection).
    With a ``hot`` cache, document reads are served from it when they can
    be and fill it when they may (``cache.hot.cache`` states when), and
    every write drops its document's entry before it is answered.
    With a ``feed``, every write script also logs its change
    (``cache.feed.streams``); ``op`` names the operation it logs.
    """

    def __init__(
        self,
        link: Link,
        clock: Callable[[], float] = time.time,
        patch_attempts: int = 100,
        write_link: Optional[Link] = None,
        write_concern: WriteConcern = PRIMARY_ONLY,
        hot: Optional[HotCache] = None,
        variants: Variants = DEFAULT_VARIANTS,
        feed: FeedLog = NO_FEED,
    ) -> None:
        self._link = link
        self._feed = feed  # an exact count logs the expiries it carries out (cache.indexes.counts)
        self.writes = DocumentWrites(link, write_link, write_concern, clock, patch_attempts, hot, variants, feed)
        self.reads = DocumentReads(link, hot)
        self.pages = DocumentPages(link)
        self.index_builds = IndexBuilds(link)  # cache.indexes.builds: resumed by the queries that meet one
        # The store's operations are its parts' bound methods, not methods of
        # its own that call them: a read, the hot path, pays no call more.
        reads, pages, writes = self.reads, self.pages, self.writes
        self.get = reads.get
        self.get_or_wait = reads.get_or_wait
        self.get_along = reads.get_along
        self.cached = reads.cached
        self.forget = reads.forget
        self.forgetting = reads.forgetting
        self.page = pages.page
        self.scan = pages.scan
        self.count = pages.count
        self.get_many = pages.get_many
        self.put = writes.put
        self.create = writes.create
        self.patch = writes.patch
        self.delete = writes.delete
        self.new_id = writes.new_id
        self.new_etag = writes.new_etag
        self.prepare_put = writes.prepare_put
        self.prepare_delete = writes.prepare_delete

    def query(self, collection: bytes, query: index_queries.Query, budget: int) -> defer.Deferred:
        """A page of a query over a declared index (``cache.indexes.queries``)."""
        return index_reads.run(self._link, collection, query, budget)

    def count_of(
        self, collection: bytes, query: Optional[index_queries.Query], after: Optional[bytes], exact: bool
    ) -> defer.Deferred:
        """The ``Count`` of ``query``'s documents, or (None) of the collection's list after the id ``after``
        (``cache.indexes.counts``)."""
        if query is None:
            return index_counts.for_list(self._link, collection, after, exact, self._feed)
        return index_counts.for_query(self._link, collection, query, exact, self._feed)

    def ping(self) -> defer.Deferred:
        """Fires when Redis answers a PING."""
        return self._link.execute(b"PING")
