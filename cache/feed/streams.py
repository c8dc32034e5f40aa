"""A collection's change feed in Redis: every write as an event, in capped streams.

Layout: one stream per shard of the collection (``cache.keys.feed_key``),
``jw:{<coll>:<shard>}:f``, in the hash slot of the shard's documents, so the
write scripts (``cache.documents.scripts``) append the event in the same script as the
write, on Redis Cluster too, where a script may touch one slot only. One
stream per collection would have to live in one slot, which a cluster
cannot write atomically with documents spread over sixteen. An event is
``o`` (``put``, ``create``, ``patch``, ``delete`` or ``expire``), ``i`` (the
document id) and ``e`` (the new ETag; empty for a delete or an expiry); its
time is its stream id's milliseconds (Redis's clock when it was written). An
expiry's event also has ``t``, when the document's TTL ran out (ms); the
event of a write whose request was sampled for tracing has ``c``, that
request's W3C ``traceparent`` (``FeedLog.script_parts``). Events of one
document are in one stream, in the order of its writes.

Each stream is capped (``FeedLog``: a length per collection, divided over
the shards, and optionally an age), trimmed approximately (whole listpack
nodes, ~100 entries) as events are added. A reader whose position is older
than what a stream kept has lost events: ``read`` says so, rather than
resume past a gap (``READ`` says exactly when).

The write scripts also PUBLISH a nudge on the collection's channel
(``channel``): the shard and the new id. Workers that follow the
collection read the shard on a nudge (``handlers.feed.hub``).

Expiries are events too, logged by the script that carries them out
(``cache.indexes.expiry_scripts``, run by ``cache.documents.expiry``'s sweeper
or by a write that recreates the document), not from Redis's keyspace
notifications, which a disconnected subscriber misses for good
(docs/design/expiry.md).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache import keys, trace_scope
from cache.feed.position import ZERO, Position, StreamId, advanced, format_id, parse_id
from cache.indexes.declared import MAX_FIELDS, MAX_INDEXES
from cache.indexes.values import MAX_STRING_BYTES
from cache.redis.link import Link
from cache.redis.script import Script

CHANNEL_PREFIX = b"jw:feed:"
OPS = (b"put", b"create", b"patch", b"delete", b"expire")

# KEYS: one shard's stream. ARGV: the position to read after (ms, seq), the
# last id to read ('+': to the end), how many at most (0: only check).
# Returns {0, entries}, or {1} when events after the position are gone:
# - the stream is behind the position (events the reader saw were lost
#   with a failed-over primary, or the stream was deleted);
# - entries were trimmed (entries-added > length) and the position is
#   older than the oldest kept. Redis 7.0 records no id for a trim (its
#   max-deleted-entry-id counts XDEL only), so a position that is exactly
#   the last entry trimmed is reported lost too: it is at the cap's edge.
READ = Script(
    b"""
local at_ms, at_seq = tonumber(ARGV[1]), tonumber(ARGV[2])
local function compare(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  ms, seq = tonumber(ms), tonumber(seq)
  if at_ms ~= ms then return at_ms < ms and -1 or 1 end
  if at_seq ~= seq then return at_seq < seq and -1 or 1 end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  if at_ms == 0 and at_seq == 0 then return {0, {}} end
  return {1}
end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local field = {}
for i = 1, #info, 2 do field[info[i]] = info[i + 1] end
if compare(field['last-generated-id']) > 0 then return {1} end
if tonumber(field['entries-added']) > tonumber(field['length']) then
  local first = field['first-entry']
  local oldest = first and first[1] or field['last-generated-id']
  if compare(oldest) < 0 then return {1} end
end
if ARGV[4] == '0' then return {0, {}} end
return {0, redis.call('XRANGE', KEYS[1], '(' .. ARGV[1] .. '-' .. ARGV[2], ARGV[3], 'COUNT', ARGV[4])}
"""
)


MAX_ID_BYTES = 128  # a document id's most (handlers.http.validation)
# The most bytes one event counts (feed_lua's event_bytes: 48, then each field and value and one more, and a
# quarter more for the allocator): o, i, e with the longest operation, id and ETag, and with MAX_INDEXES indexes
# each entry after the write (x:<name>:<version>) and the one before (w:...), the longest names and entries of
# MAX_FIELDS strings of MAX_STRING_BYTES bytes, all NULs (each escaped in two bytes, then a two-byte end), then
# the longest id, and a sampled request's traceparent (c, 55 bytes): 65,491 bytes.
_MARK = 2 + 32 + 1 + 12 + 1 + MAX_FIELDS * (2 * MAX_STRING_BYTES + 2) + MAX_ID_BYTES + 1
_TRACE = 2 + 55 + 1
MAX_EVENT_BYTES = (48 + (2 + 7 + 2 + MAX_ID_BYTES + 1 + 2 + 65) + _TRACE + 2 * MAX_INDEXES * _MARK) * 5 // 4

# Each shard as the nudge names it: two hex digits.
_SHARD_NAMES = tuple(b"%02x" % shard for shard in range(keys.INDEX_SHARDS))


def channel(collection: bytes) -> bytes:
    """Where the write scripts nudge the workers that follow ``collection``."""
    return CHANNEL_PREFIX + collection


@dataclass(frozen=True)
class FeedLog:
    """What the write scripts need to log a change: the stream, the caps, the channel.

    ``max_events`` is per collection: each shard's stream keeps about
    ``max_events / INDEX_SHARDS`` of them (writes spread over ids spread
    over shards). ``max_age`` (seconds, 0: none) also drops older events.
    ``max_bytes`` is per collection too, divided over the shards alike:
    the bytes of events (``cache.feed.feed_lua``' event_bytes, at most
    ``MAX_EVENT_BYTES`` each) a shard's stream keeps.
    """

    enabled: bool = True
    max_events: int = 100_000
    max_age: int = 0
    max_bytes: int = 64 * 1024 * 1024

    def script_keys(self, collection: bytes, doc_id: bytes) -> List[bytes]:
        """The write script's extra key: the shard's stream (none with the feed off)."""
        return self.script_parts(b"", collection, keys.shard_of(doc_id))[0]

    def script_args(self, op: bytes, collection: bytes, doc_id: bytes) -> List[Any]:
        """The write script's last arguments (``cache.feed.feed_lua.FEED_LUA``)."""
        return self.script_parts(op, collection, keys.shard_of(doc_id))[1]

    def script_parts(self, op: bytes, collection: bytes, shard: int) -> Tuple[List[bytes], List[Any]]:
        """``script_keys`` and ``script_args`` of a write to ``shard`` (its id hashed once, by the caller).

        Made while a request sampled for tracing runs (``cache.trace_scope``),
        the operation is followed by a space and the request's
        ``traceparent``, which the script logs as the event's ``c``: a feed
        consumer links its work to the write's trace. One argument more per
        write would cost every batch; only sampled writes pay this. An expiry
        is no request's doing: its event never carries one.
        """
        if not self.enabled:
            return [], []
        traced = trace_scope.active()
        if traced is not None and op != b"expire":
            op = b"%s %s" % (op, traced.traceparent.encode())
        per_shard = -(-self.max_events // keys.INDEX_SHARDS)
        budget = max(self.max_bytes // keys.INDEX_SHARDS, MAX_EVENT_BYTES)
        args = [op, per_shard, self.max_age * 1000, channel(collection), _SHARD_NAMES[shard], budget]
        return [keys.feed_key(collection, shard)], args


NO_FEED = FeedLog(enabled=False)


@dataclass(frozen=True)
class Event:
    """One write: where it is in the feed, what it did, to which document."""

    shard: int
    stream_id: StreamId
    op: bytes
    doc_id: bytes
    etag: bytes  # empty for a delete
    # In a shard that keeps indexes: the document's entries after the write (x:<name>:<v>) and, where one
    # changed, before it (w:<name>:<v>, b"" for none), as the write's script set them (cache.feed.live_queries).
    marks: Tuple[Tuple[bytes, bytes], ...] = ()
    expired_at: int = 0  # an expiry's: when the document's TTL ran out, ms (Redis's clock)
    trace: bytes = b""  # the writing request's traceparent, when it was sampled for tracing

    def json(self, with_doc: bool = False, doc: Optional[bytes] = None, matches: Optional[bool] = None) -> bytes:
        """``{"op","id","etag","time"[,"expired_at"][,"trace"][,"matches"][,"doc"]}``; ``doc`` inlined as
        stored, never re-encoded; ``matches``: a live query's judgement (``cache.feed.live_queries``).

        Ids match ``[A-Za-z0-9._~-]`` and ETags are quoted base64url with a
        counter (``cache.documents.ids``), so only the ETag's quotes need escaping.
        """
        etag = b'"\\"' + self.etag[1:-1] + b'\\""' if self.etag else b"null"
        head = b'{"op":"%s","id":"%s","etag":%s,"time":"%s"' % (
            self.op,
            self.doc_id,
            etag,
            iso_time(self.stream_id[0]),
        )
        if self.expired_at:
            head += b',"expired_at":"%s"' % iso_time(self.expired_at)
        if self.trace:  # lower-case hex and dashes (api.tracing formats it): nothing to escape
            head += b',"trace":"%s"' % self.trace
        if matches is not None:
            head += b',"matches":true' if matches else b',"matches":false'
        if not with_doc:
            return head + b"}"
        return head + b',"doc":' + (b"null" if doc is None else doc) + b"}"


_last_second: List[Any] = [-1, b""]


def iso_time(ms: int) -> bytes:
    """RFC 3339 UTC with milliseconds; the date part made once per second."""
    second, millis = divmod(ms, 1000)
    if _last_second[0] != second:
        _last_second[0], _last_second[1] = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
    return _last_second[1] + b".%03dZ" % millis


@dataclass(frozen=True)
class ShardRead:
    """What one shard answered: lost (gone past the position), or its next events."""

    shard: int
    lost: bool
    events: List[Event]
    full: bool  # as many as asked for: more may follow


@dataclass(frozen=True)
class Page:
    """Events in stream-id order and the position after them; ``lost`` if the start was gone."""

    lost: bool
    events: List[Event]
    position: Position
    more: bool


# (shard, read after this id, up to this id or None for the end, at most this many; 0: check only)
Request = Tuple[int, StreamId, Optional[StreamId], int]


class FeedReader:
    """Reads a collection's change feed: pages of events, the current tail, documents."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def read(self, collection: bytes, requests: Sequence[Request]) -> defer.Deferred:
        """One ``ShardRead`` per request, in one round trip (the cluster link splits it by node)."""
        commands = [
            READ.call(
                [keys.feed_key(collection, shard)],
                [b"%d" % after[0], b"%d" % after[1], b"+" if end is None else format_id(end), count],
            )
            for shard, after, end, count in requests
        ]
        if not commands:
            return defer.succeed([])
        return self._link.pipeline_scripts(commands, [READ]).addCallback(_shard_reads, requests)

    def page(
        self,
        collection: bytes,
        position: Position,
        limit: int,
        bound: Optional[Position] = None,
        check_all: bool = False,
        per_shard: Optional[int] = None,
    ) -> defer.Deferred:
        """Up to ``limit`` events after ``position`` (each shard up to ``bound``'s id if given).

        ``check_all``: shards with nothing to read (at ``bound``) are still
        checked for lost events, so a stale position is found on the first read.
        ``per_shard``: events read from each shard at most (default ``limit``).
        """
        requests: List[Request] = []
        for shard, after in enumerate(position):
            end = None if bound is None else bound[shard]
            if end is not None and after >= end:
                if check_all:
                    requests.append((shard, after, None, 0))
                continue
            requests.append((shard, after, end, limit if per_shard is None else per_shard))
        return self.read(collection, requests).addCallback(_page_of, position, limit)

    def tail(self, collection: bytes) -> defer.Deferred:
        """The position of the newest event of every shard: "now"."""
        commands = [
            (b"XREVRANGE", keys.feed_key(collection, shard), b"+", b"-", b"COUNT", 1)
            for shard in range(keys.INDEX_SHARDS)
        ]
        return self._link.pipeline(commands).addCallback(_tail_of)

    def documents(self, collection: bytes, doc_ids: Sequence[bytes]) -> defer.Deferred:
        """The stored bytes of each document now (None if gone), in one round trip."""
        if not doc_ids:
            return defer.succeed([])
        return self._link.pipeline([(b"HGET", keys.document_key(collection, doc_id), b"b") for doc_id in doc_ids])


def _shard_reads(replies: List[Any], requests: Sequence[Request]) -> List[ShardRead]:
    reads = []
    for (shard, _, _, count), reply in zip(requests, replies):
        if int(reply[0]) == 1:
            reads.append(ShardRead(shard, True, [], False))
            continue
        events = [_event(shard, entry) for entry in reply[1]]
        reads.append(ShardRead(shard, False, events, count > 0 and len(events) >= count))
    return reads


def _event(shard: int, entry: List[Any]) -> Event:
    stream_id, fields = entry
    values = dict(zip(fields[::2], fields[1::2]))
    marks = tuple((name, value) for name, value in values.items() if name[:2] in _MARKS) if len(values) > 3 else ()
    op = values.get(b"o", b"put")
    expired_at = int(values.get(b"t", 0)) if op == b"expire" else 0
    doc_id, etag, trace = values.get(b"i", b""), values.get(b"e", b""), values.get(b"c", b"")
    return Event(shard, parse_id(stream_id), op, doc_id, etag, marks, expired_at, trace)


_MARKS = (b"x:", b"w:")


def merged(reads: Sequence[ShardRead]) -> List[Event]:
    """The events of several shards in stream-id order (each shard's are in order already)."""
    return list(heapq.merge(*(read.events for read in reads), key=lambda event: (event.stream_id, event.shard)))


def _page_of(reads: List[ShardRead], position: Position, limit: int) -> Page:
    if any(read.lost for read in reads):
        return Page(True, [], position, False)
    events = merged(reads)
    full = [read.events[-1].stream_id for read in reads if read.full]
    if full:
        # A shard read to its count may hold older events than the other
        # shards' last ones: stop there, so a page stays in stream-id order.
        cutoff = min(full)
        events = [event for event in events if event.stream_id <= cutoff]
    more = len(events) > limit or bool(full)
    events = events[:limit]
    for event in events:
        position = advanced(position, event.shard, event.stream_id)
    return Page(False, events, position, more)


def _tail_of(replies: List[Any]) -> Position:
    return tuple(parse_id(reply[0][0]) if reply else ZERO for reply in replies)
