"""Counts of a query's or a list page's documents (``Prefer: count=exact``): from the index, never a document.

A query's count is the number of its entries: one script per shard sums
``ZLEXCOUNT`` over the query's ranges (``cache.indexes.queries.Range``: one,
or one per value of an ``in``) in that shard's entries; a list page's is the
shard's id index (``ZCARD``). No document is read and nothing is scanned:
each ``ZLEXCOUNT`` is O(log N) whatever the number it answers. Each entry
is one document: a one-value field has one entry per document, the ranges
of an ``in`` are disjoint (its values are distinct encodings, each
self-delimiting), and an array field answers only ``cs.{x}``, whose entry
for ``x`` a document has once however often its array holds ``x``
(``cache.indexes.filters`` refuses ``in`` or a range on an array field).

Consistency: each shard's count is exact at the moment its script runs;
the 16 shards' scripts run one after another (on a cluster, on their own
nodes), so the sum is not one snapshot of the collection: a document is
counted as it was when its own shard was counted. Under concurrent writes a
count is between the documents that matched throughout the request and
those that matched at some moment of it.

Where the page starts (``Count.before``): the entries of the same ranges
before the cursor, counted in the same script (the total less the part the
page reads, ``Query.bounds``), so ``before`` and ``total`` are one shard's
one moment each.

``estimated`` (``Prefer: count=estimated``) runs the same counts without
first expiring the shard's documents that are due (the expiry's step, at
``EXPIRY_STEP`` in the script): entries of documents that expired in the
last moments, not swept yet, may be counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache import keys
from cache.indexes.queries import IndexNotReady, Query
from cache.redis.link import Link
from cache.redis.script import Script

# KEYS: the shard's id index (jw:{<coll>:<shard>}:i, whose tag names every key of the shard), then, for a
# query, the index's entries. ARGV: '1' to expire the shard's due documents first (exact), the index's
# '<name>:<version>' ('' for a list page), then each range's low and high (ZLEXCOUNT bounds) and the low
# and high of its part after the cursor ('' and '': no cursor). Returns {state, total, after}: state
# 'ok', 'missing' (no such index in this shard) or 'building'; after: the entries the page reads on.
COUNT = Script(
    rb"""
local tag = string.sub(KEYS[1], 4, -2)  -- '{<coll>:<shard>}:'
if ARGV[2] ~= '' then
  local state = redis.call('HGET', 'ji:' .. tag .. 'xst', ARGV[2])
  if not state then return {'missing', 0, 0} end
  if state ~= '1' then return {'building', 0, 0} end
end
if ARGV[1] == '1' then
  -- EXPIRY_STEP: the shard's documents past their expiry leave the id index and every index here, before
  -- anything is counted, so that an exact count never includes a document already expired: the expiry's
  -- expire_due(KEYS[1], step, feed_key, feed_args) (cache/indexes/expiry_scripts.py, its Lua prepended to
  -- this script's, the feed's key and arguments added to this call's; docs/design/expiry.md says how many a step).
end
local entries = KEYS[2] or KEYS[1]
local function counted(low, high)
  if low == '-' and high == '+' then return redis.call('ZCARD', entries) end
  return redis.call('ZLEXCOUNT', entries, low, high)
end
local total, after = 0, 0
for at = 3, #ARGV, 4 do
  local here = counted(ARGV[at], ARGV[at + 1])
  total = total + here
  if ARGV[at + 2] == '' then
    after = after + here
  else
    after = after + counted(ARGV[at + 2], ARGV[at + 3])
  end
end
return {'ok', total, after}
"""
)


@dataclass(frozen=True)
class Count:
    """How many documents a query (or a list) holds, and how many of them come before its page's first."""

    total: int
    before: int


def for_query(link: Link, collection: bytes, query: Query, exact: bool = True) -> defer.Deferred:
    """The ``Count`` of ``query``'s documents in ``collection``; ``IndexNotReady`` while its index is built."""
    index = query.index
    name, version = index.name.encode(), index.version.encode()
    arguments: List[Any] = [b"1" if exact else b"0", name + b":" + version]
    for at, range_ in enumerate(query.ranges):
        arguments += [range_.low, range_.high, *(query.bounds(at) if query.after is not None else (b"", b""))]
    commands = [
        COUNT.call(
            [keys.index_key(collection, shard), keys.index_entries_key(collection, shard, name, version)], arguments
        )
        for shard in range(keys.INDEX_SHARDS)
    ]
    return link.pipeline_outcomes(commands, [COUNT]).addCallback(_summed, index.name)


def for_list(link: Link, collection: bytes, after: Optional[bytes], exact: bool = True) -> defer.Deferred:
    """The ``Count`` of ``collection``'s documents, a list page after the id ``after`` (None: the first)."""
    rest = (b"(" + after, b"+") if after is not None else (b"", b"")
    arguments = [b"1" if exact else b"0", b"", b"-", b"+", *rest]
    commands = [COUNT.call([keys.index_key(collection, shard)], arguments) for shard in range(keys.INDEX_SHARDS)]
    return link.pipeline_outcomes(commands, [COUNT]).addCallback(_summed, "")


def _summed(outcomes: Sequence[Tuple[bool, Any]], name: str) -> Count:
    total = after = unready = 0
    for ok, reply in outcomes:
        if not ok:
            raise reply
        state, here, rest = reply
        if state != b"ok":
            unready += 1
        total, after = total + here, after + rest
    if unready:
        raise IndexNotReady(name, len(outcomes) - unready, len(outcomes))
    return Count(total, total - after)
