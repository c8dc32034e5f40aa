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

Expiry: an exact count first carries out, in the same script, the shard's
expiries that are due (``expire_due``, the sweeper's step: their entries
leave, their ``expire`` events are logged), so it never counts a document
past its expiry, whatever the sweeper's lag. A shard with more due than
``EXPIRY_STEP`` (a mass expiry the sweeper has not caught up with) is counted
again, each time after ``EXPIRY_STEP`` more, up to ``EXPIRY_ROUNDS`` times;
past that its count may include expired documents, and the answer says
``estimated`` (``Count.exact``) rather than claim what it is not.
``estimated`` (``Prefer: count=estimated``) skips the expiry step: entries of
documents that expired in the last moments (within the sweeper's bound,
docs/api.md) may be counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from twisted.internet import defer

from cache import keys
from cache.documents.scripts import EXPIRE_DUE_LUA
from cache.feed.streams import NO_FEED, FeedLog
from cache.indexes.queries import IndexNotReady, Query
from cache.redis.link import Link
from cache.redis.script import Script

# How many due documents an exact count carries out per shard and script (4 of the sweeper's steps,
# cache.documents.expiry.STEP), and how many scripts it sends a shard whose due documents are more: a count
# waits on a mass expiry for a bounded share of Redis (docs/design/expiry.md, "Costs measured"), then says so.
EXPIRY_STEP = 128
EXPIRY_ROUNDS = 8

# KEYS: the shard's id index (jw:{<coll>:<shard>}:i, whose tag names every key of the shard), for a query the
# index's entries, then (with expiry and the feed on) the shard's change feed. ARGV: how many documents past
# their expiry to carry out first ('0': none, an estimated count), the index's '<name>:<version>' ('' for a
# list page), the number N of the feed's arguments and those N (FeedLog.script_parts' for the 'expire' events),
# then each range's low and high (ZLEXCOUNT bounds) and the low and high of its part after the cursor ('' and
# '': no cursor). Returns {state, total, after}: state 'ok', 'missing' (no such index in this shard),
# 'building', or 'behind' (counted, but more of the shard's documents are past their expiry than the step
# carried out: some are counted); after: the entries the page reads on.
COUNT = Script(
    (
        EXPIRE_DUE_LUA
        + r"""
local tag = string.sub(KEYS[1], 4, -2)  -- '{<coll>:<shard>}:'
if ARGV[2] ~= '' then
  local state = redis.call('HGET', 'ji:' .. tag .. 'xst', ARGV[2])
  if not state then return {'missing', 0, 0} end
  if state ~= '1' then return {'building', 0, 0} end
end
local feed_count, step, answer = tonumber(ARGV[3]), tonumber(ARGV[1]), 'ok'
if step > 0 then
  -- The shard's documents past their expiry leave the id index and every index here, their events logged, before
  -- anything is counted (cache.indexes.expiry_scripts' expire_due, the sweeper's step).
  local feed_key, feed_args = nil, nil
  if feed_count > 0 then
    nudges = {}
    feed_key, feed_args = KEYS[#KEYS], {}
    for i = 4, 3 + feed_count do feed_args[#feed_args + 1] = ARGV[i] end
  end
  local done = expire_due(KEYS[1], step, feed_key, feed_args)
  if nudges then
    for channel, shards in pairs(nudges) do
      for shard, event in pairs(shards) do redis.call('PUBLISH', channel, shard .. ' ' .. event) end
    end
  end
  -- It looked at a whole step, and the next due is due already: what is left would be counted.
  if done[2] == step and done[3] ~= '' then
    local now = redis.call('TIME')
    if tonumber(done[3]) <= tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) then answer = 'behind' end
  end
end
local entries = KEYS[1]
if ARGV[2] ~= '' then entries = KEYS[2] end
local function counted(low, high)
  if low == '-' and high == '+' then return redis.call('ZCARD', entries) end
  return redis.call('ZLEXCOUNT', entries, low, high)
end
local total, after = 0, 0
for at = 4 + feed_count, #ARGV, 4 do
  local here = counted(ARGV[at], ARGV[at + 1])
  total = total + here
  if ARGV[at + 2] == '' then
    after = after + here
  else
    after = after + counted(ARGV[at + 2], ARGV[at + 3])
  end
end
return {answer, total, after}
"""
    ).encode()
)


@dataclass(frozen=True)
class Count:
    """How many documents a query (or a list) holds, and how many of them come before its page's first.

    ``exact``: False when asked estimated, or when a shard's expiries were more than an exact count carries out.
    """

    total: int
    before: int
    exact: bool = True


def for_query(
    link: Link, collection: bytes, query: Query, exact: bool = True, feed: FeedLog = NO_FEED
) -> defer.Deferred:
    """The ``Count`` of ``query``'s documents in ``collection``; ``IndexNotReady`` while its index is built."""
    index = query.index
    name, version = index.name.encode(), index.version.encode()
    ranges: List[Any] = []
    for at, range_ in enumerate(query.ranges):
        ranges += [range_.low, range_.high, *(query.bounds(at) if query.after is not None else (b"", b""))]
    label = name + b":" + version

    def call(shard: int, step: int) -> Any:
        feed_keys, feed_args = feed.script_parts(b"expire", collection, shard) if step else ([], [])
        shard_keys = [keys.index_key(collection, shard), keys.index_entries_key(collection, shard, name, version)]
        return COUNT.call([*shard_keys, *feed_keys], [step, label, len(feed_args), *feed_args, *ranges])

    return _counted(link, call, exact, index.name)


def for_list(
    link: Link, collection: bytes, after: Optional[bytes], exact: bool = True, feed: FeedLog = NO_FEED
) -> defer.Deferred:
    """The ``Count`` of ``collection``'s documents, a list page after the id ``after`` (None: the first)."""
    rest = (b"(" + after, b"+") if after is not None else (b"", b"")

    def call(shard: int, step: int) -> Any:
        feed_keys, feed_args = feed.script_parts(b"expire", collection, shard) if step else ([], [])
        arguments = [step, b"", len(feed_args), *feed_args, b"-", b"+", *rest]
        return COUNT.call([keys.index_key(collection, shard), *feed_keys], arguments)

    return _counted(link, call, exact, "")


@defer.inlineCallbacks
def _counted(link: Link, call: Any, exact: bool, name: str) -> Any:
    """The 16 shards' counts summed; a shard ``behind`` its expiries counted again, ``EXPIRY_ROUNDS`` times at most."""
    step = EXPIRY_STEP if exact else 0
    counts: Dict[int, Tuple[bytes, int, int]] = {}
    shards = list(range(keys.INDEX_SHARDS))
    for _ in range(EXPIRY_ROUNDS if exact else 1):
        outcomes = yield link.pipeline_outcomes([call(shard, step) for shard in shards], [COUNT])
        for shard, (ok, reply) in zip(shards, outcomes):
            if not ok:
                raise reply
            counts[shard] = reply
        shards = [shard for shard in shards if counts[shard][0] == b"behind"]
        if not shards:
            break
    states = [state for state, _, _ in counts.values()]
    unready = sum(state not in (b"ok", b"behind") for state in states)
    if unready:
        raise IndexNotReady(name, len(states) - unready, len(states))
    total = sum(here for _, here, _ in counts.values())
    after = sum(rest for _, _, rest in counts.values())
    return Count(total, total - after, exact and b"behind" not in states)
