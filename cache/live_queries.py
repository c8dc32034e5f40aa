"""A live query: a collection's change feed filtered by a query over one of its declared indexes.

``GET /v1/_changes/{coll}?status=eq.open`` answers the events of the
documents that match the query after their write, or matched it before and
no longer do, each with ``"matches": true`` or ``false``. The filters are a
query's (``cache.index_queries``: equality on an index's first fields, a
range on the next), planned onto the same index, with the same bounds.

How it stays exact: in a shard that keeps indexes, each write's event
carries the document's entries as its script set them (``cache.scripts``,
the event's marks): each after the write (``x:<index>:<version>``) and,
where one changed, the one before (``w:...``, empty for none); a delete
carries those it removed. An event is the query's when the index's entry
after or before the write is in the query's range, and ``matches`` is
whether the one after is. So each write is judged at its place in the feed,
by its own values, without reading the document or keeping a set of
matching ids per subscriber; a document that stops matching is told even if
it matched since before the subscription began.

Events with no marks for the index match nothing: those written before its
spec reached the shard, and those of a shard with indexes but no feed
(``JETWAY_FEED=off`` makes no events at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cache.change_feed import Event
from cache.index_queries import Query, within


@dataclass(frozen=True)
class LiveQuery:
    """The index entry an event's marks are read for, and the range it must be in."""

    entry_mark: bytes  # x:<name>:<version>
    before_mark: bytes  # w:<name>:<version>
    low: bytes  # ZRANGEBYLEX bounds, as the query reads them
    high: bytes

    @classmethod
    def of(cls, query: Query) -> LiveQuery:
        index = query.index
        named = b"%s:%s" % (index.name.encode(), index.version.encode())
        return cls(b"x:" + named, b"w:" + named, query.low, query.high)

    def judge(self, event: Event) -> Optional[bool]:
        """None when ``event`` is not the query's; else whether its document matches after the write."""
        now: Optional[bytes] = None
        before: Optional[bytes] = None
        changed = False
        for name, value in event.marks:
            if name == self.entry_mark:
                now = value
            elif name == self.before_mark:
                before, changed = value or None, True
        if not changed:
            before = now
        matches = now is not None and within(now, self.low, self.high)
        if matches or (before is not None and within(before, self.low, self.high)):
            return matches
        return None
