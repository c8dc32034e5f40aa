"""A live query: a collection's change feed filtered by a query over one of its declared indexes.

``GET /v1/_changes/{coll}?status=eq.open`` answers the events of the
documents that match the query after their write, or matched it before and
no longer do, each with ``"matches": true`` or ``false``. The filters are a
query's (``cache.indexes.queries``: equality on an index's first fields, or
``in`` on one of them, a range on the next), planned onto the same index,
with the same bounds: one range, or one per value of an ``in``.

How it stays exact: in a shard that keeps indexes, each write's event
carries the document's entries as its script set them (``cache.documents.scripts``,
the event's marks): each after the write (``x:<index>:<version>``) and,
where one changed, the one before (``w:...``, empty for none); a delete
carries those it removed. An event is the query's when the index's entry
after or before the write is in one of the query's ranges, and ``matches`` is
whether the one after is. So each write is judged at its place in the feed,
by its own values, without reading the document or keeping a set of
matching ids per subscriber; a document that stops matching is told even if
it matched since before the subscription began.

A multi-entry index's mark (an array field's, ``cs``) holds all the
document's entries (``cache.indexes.values.pack_entries``): the event is
the query's when one entry after or before the write is in its range, and
``matches`` is whether one after it is, as the query's read finds the
document by any of its entries.

Events with no marks for the index match nothing: those written before its
spec reached the shard, and those of a shard with indexes but no feed
(``JETWAY_FEED=off`` makes no events at all).

Many queries at once (``LiveIndex``): a worker's lane judges each event
against the queries its entries can be in, found by their ranges in an
interval tree per index, not against every distinct query the lane follows
(2,000 distinct filters judged one by one held a worker's reactor past a
second, issue #55 item 6). The tree only narrows: each candidate is judged
exactly, as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from cache.feed.streams import Event
from cache.indexes.queries import Query, within
from cache.indexes.values import is_multi, unpack_entries
from cache.json.codec import JsonError, loads
from cache.ownership import OwnerRule


@dataclass(frozen=True)
class LiveQuery:
    """The index entry an event's marks are read for, and the ranges it must be in (one of them)."""

    entry_mark: bytes  # x:<name>:<version>
    before_mark: bytes  # w:<name>:<version>
    ranges: Tuple[Tuple[bytes, bytes], ...]  # ZRANGEBYLEX bounds (low, high), as the query reads them
    # A user's under an owner rule (cache.ownership): the rule and the owner a document attached to an event must
    # have (``shows``). Part of the query's identity, so its frames are never shared with another's.
    owner: Optional[Tuple[OwnerRule, str]] = None

    @classmethod
    def of(cls, query: Query, owner: Optional[Tuple[OwnerRule, str]] = None) -> LiveQuery:
        index = query.index
        named = b"%s:%s" % (index.name.encode(), index.version.encode())
        ranges = tuple((range_.low, range_.high) for range_ in query.ranges)
        return cls(b"x:" + named, b"w:" + named, ranges, owner)

    def shows(self, doc: Optional[bytes]) -> Optional[bytes]:
        """The document an event may carry: as stored, or None when an owner rule's user does not own it (now)."""
        if doc is None or self.owner is None:
            return doc
        rule, owner = self.owner
        try:
            value = loads(doc if isinstance(doc, bytes) else bytes(doc))
        except JsonError:
            return None
        return doc if rule.owner_in(value) == owner else None

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
        matches = now is not None and self.holds(now)
        if matches or (before is not None and self.holds(before)):
            return matches
        return None

    def holds(self, value: bytes) -> bool:
        """Whether a mark's ``value`` (an entry, or a multi-entry index's packed entries) has an entry in one of
        the query's ranges."""
        entries = unpack_entries(value) if is_multi(self.entry_mark) else (value,)
        return any(within(entry, low, high) for entry in entries for low, high in self.ranges)


# (lowest, highest or None for no end, query): a query's range, taken inclusive whatever its bounds say (a
# superset: each candidate is judged exactly).
_Span = Tuple[bytes, Optional[bytes], LiveQuery]


def _spans(query: LiveQuery) -> Iterator[_Span]:
    for low, high in query.ranges:
        yield (
            b"" if low in (b"-", b"+") else low[1:],
            None if high == b"+" else (b"" if high == b"-" else high[1:]),
            query,
        )


class _Node:
    """A centred interval tree's node: the spans that hold ``center``, by low and by high; the others below.

    ``center`` is an end of some span, which therefore stays here: each node takes one at least.
    """

    __slots__ = ("by_high", "by_low", "center", "left", "right")

    def __init__(self, spans: Sequence[_Span]) -> None:
        ends = sorted(end for low, high, _ in spans for end in (low, high) if end is not None)
        self.center = ends[len(ends) // 2]
        here: List[_Span] = []
        left: List[_Span] = []
        right: List[_Span] = []
        for span in spans:
            if span[1] is not None and span[1] < self.center:
                left.append(span)
            elif span[0] > self.center:
                right.append(span)
            else:
                here.append(span)
        self.by_low = sorted(here, key=lambda span: span[0])
        self.by_high = sorted(here, key=lambda span: (span[1] is None, span[1] or b""), reverse=True)
        self.left = _Node(left) if left else None
        self.right = _Node(right) if right else None

    def holding(self, value: bytes) -> Iterator[LiveQuery]:
        node: Optional[_Node] = self
        while node is not None:
            if value < node.center:
                for low, _, query in node.by_low:
                    if low > value:
                        break
                    yield query
                node = node.left
            elif value > node.center:
                for _, high, query in node.by_high:
                    if high is not None and high < value:
                        break
                    yield query
                node = node.right
            else:
                for _, _, query in node.by_low:
                    yield query
                return


class LiveIndex:
    """Many live queries, each event judged only against those whose range may hold one of its entries."""

    def __init__(self, queries: Iterable[LiveQuery]) -> None:
        self.queries = tuple(set(queries))
        by_index: Dict[bytes, List[_Span]] = {}
        for query in self.queries:
            for span in _spans(query):
                if span[1] is None or span[0] <= span[1]:  # else an empty range: nothing is in it
                    by_index.setdefault(query.entry_mark, []).append(span)
        self._trees: Dict[bytes, _Node] = {}
        for spans in by_index.values():
            tree = _Node(spans)
            query = spans[0][2]
            self._trees[query.entry_mark] = self._trees[query.before_mark] = tree

    def judge(self, event: Event) -> Dict[LiveQuery, bool]:
        """The queries ``event`` is one of (``LiveQuery.judge`` not None), each with its judgement."""
        candidates = set()
        for name, value in event.marks:
            tree = self._trees.get(name)
            if tree is not None:
                for entry in unpack_entries(value) if is_multi(name) else (value,):
                    candidates.update(tree.holding(entry))
        judged = {}
        for query in candidates:
            matches = query.judge(event)
            if matches is not None:
                judged[query] = matches
        return judged
