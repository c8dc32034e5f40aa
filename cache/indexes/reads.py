"""A planned query read from Redis: every stream (a range of the query in an index shard) read by its script, merged.

Every shard's ``QUERY`` script (``cache.indexes.query_script``) reads a range's
entries in order and the bodies of the documents that still hold them, in
the same script, so each body answered matches the query when it is read.
A query reads each of its ranges (``cache.indexes.queries.Range``: one, or
one per value of an ``in``) from every shard, all in one pipeline, each
stream with an equal share of the response budget, so the page holds no
more than the budget whatever the number of streams. The streams are
merged in the page's order of their entries' keys (``Query.key_of``), as
the change feed merges its streams, and a page ends where the first stream
that had more stopped, so nothing in between is skipped.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache import keys
from cache.errors import WriteConflict
from cache.indexes.queries import IndexNotReady, Query
from cache.indexes.query_script import QUERY
from cache.indexes.values import id_of
from cache.redis.link import Link

# Entries a shard's script looks at, beyond the page, before it stops (dropping stale ones on its way).
_LOOK_AHEAD = 64


@dataclass
class Found:
    """A page of a query: its documents' bodies in order, and the key to continue after (None: the end): the
    last entry's (``Query.key_of``: the entry itself, but for an ``in``'s).

    ``oversize``: the page could not start, its first document being more
    than a stream's share of the budget: read that entry alone.
    """

    bodies: List[bytes]
    last: Optional[bytes]
    oversize: Optional[bytes] = None
    entries: List[bytes] = field(default_factory=list)  # each body's entry (the id at its end: ``id_of``)


# Pages read again when their first document was too large for a shard's share and changed before it was read.
_ATTEMPTS = 3


@defer.inlineCallbacks
def run(link: Link, collection: bytes, query: Query, budget: int) -> Any:
    """The page ``query`` asks of ``collection``, within ``budget`` bytes of bodies; ``IndexNotReady`` while built.

    Each range is read from every shard, each such stream with an equal
    share of the budget, and the streams are merged by their entries' keys.
    """
    streams = [
        _Stream(shard, *query.bounds(at), len(query.ranges[at].lead))
        for at in range(len(query.ranges))
        for shard in range(keys.INDEX_SHARDS)
    ]
    for _ in range(_ATTEMPTS):
        page = yield _read(link, collection, query, streams, query.limit, budget // len(streams), budget)
        if page.oversize is None:
            return page
        # Alone, with the whole budget (no document is larger: api.config), in its own shard.
        entry = page.oversize
        single = b"[" + entry
        shard = keys.shard_of(id_of(entry, query.index.kinds()))
        alone = yield _read(link, collection, query, [_Stream(shard, single, single, 0)], 1, budget, budget)
        if alone.bodies:
            return Found(alone.bodies, query.key_of(entry), None, alone.entries)
    raise WriteConflict()


@dataclass(frozen=True)
class _Stream:
    """One shard's entries in one range of a query: the bounds read, and the length of the range's lead."""

    shard: int
    low: bytes
    high: bytes
    lead: int


def _read(
    link: Link, collection: bytes, query: Query, streams: Sequence[_Stream], limit: int, share: int, budget: int
) -> defer.Deferred:
    index = query.index
    name, version = index.name.encode(), index.version.encode()
    commands = [
        QUERY.call(
            [
                keys.index_spec_key(collection, stream.shard),
                keys.index_entries_key(collection, stream.shard, name, version),
            ],
            [
                name,
                version,
                stream.low,
                stream.high,
                b"1" if query.descending else b"0",
                limit,
                max(share, 1),
                index.kinds(),
                limit + _LOOK_AHEAD,
            ],
        )
        for stream in streams
    ]
    leads = [stream.lead for stream in streams]
    return link.pipeline_outcomes(commands, [QUERY]).addCallback(_merged, query, leads, limit, budget)


def _merged(outcomes: List[Tuple[bool, Any]], query: Query, leads: List[int], limit: int, budget: int) -> Found:
    """The streams' answers merged in the page's order of their keys (each entry past its stream's ``leads``)."""
    answers = []
    for ok, reply in outcomes:
        if not ok:
            raise reply
        answers.append(reply)
    unready = [answer for answer in answers if answer[0] in (b"missing", b"building")]
    if unready:
        # A shard's state is each of its streams': counted once a shard.
        per = len(query.ranges) if len(answers) == len(query.ranges) * keys.INDEX_SHARDS else 1
        raise IndexNotReady(query.index.name, (len(answers) - len(unready)) // per, len(answers) // per)
    descending = query.descending

    def before(a: bytes, b: bytes) -> bool:  # a comes before b in the page's order
        return a > b if descending else a < b

    # Where the page must end: the first place a stream stopped with more to give (a stream whose last entry
    # came without its body, over its share, stopped just before it). Its key, and its entry.
    stop: Optional[bytes] = None
    stop_entry = b""
    stop_inclusive = True
    streams: List[List[Tuple[bytes, bytes, Optional[bytes]]]] = []
    for (state, position, *rest), cut in zip(answers, leads):
        streams.append([(rest[at][cut:], rest[at], rest[at + 1]) for at in range(0, len(rest), 3)])
        if state == b"end":
            continue
        inclusive = not (rest and rest[-3] == position and rest[-2] is None)
        key = position[cut:]
        if stop is None or before(key, stop) or (key == stop and not inclusive):
            stop, stop_entry, stop_inclusive = key, position, inclusive
    # Each stream's entries come in the page's order: merged, as a list page's ids are (cache.documents.pages).
    found = heapq.merge(*streams, key=lambda triple: triple[0], reverse=descending)
    bodies: List[bytes] = []
    entries: List[bytes] = []
    last: Optional[bytes] = None
    spent = 0
    for key, entry, body in found:
        if stop is not None and (before(stop, key) or (key == stop and not stop_inclusive)):
            break  # past where a stream stopped: the next page's
        if body is None or spent + len(body) > budget:
            if last is None:
                return Found([], None, entry)
            break
        bodies.append(body)
        entries.append(entry)
        spent += len(body)
        last = key
        if len(bodies) == limit:
            return Found(bodies, last, None, entries)
    else:
        # Everything up to the stop is here: the next page starts after the stop (a stream may have looked
        # past stale entries only), or there is none.
        return Found(bodies, stop, None, entries)
    if last is None and stop is not None:
        # Nothing before the stop: its entry comes alone (over a stream's share), or a stream looked past
        # stale entries only and the next page starts after where it stopped.
        return Found([], None, stop_entry) if not stop_inclusive else Found([], stop)
    return Found(bodies, last, None, entries)
