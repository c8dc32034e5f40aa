"""This worker's change feed: the collections it follows, the streams it serves.

One ``Hub`` per collection that has subscribers or long polls here
(``handlers.feed.hub``), all fed by one nudge subscription
(``cache.feed.nudges``). Every second the streams get their heartbeat and
stall check; every ``SWEEP_TICKS`` seconds each hub looks at its shards'
tails in case a nudge was lost, and a hub idle for ``IDLE_SECONDS`` stops
following its collection. ``drain`` ends every stream with ``reconnect``
and answers every long poll, so clients go to another worker at once.

What a worker holds for the feed, whatever its clients do: per stream at
most ``buffer`` bytes of output it did not take (``handlers.feed.event_stream``),
per catching-up stream one page, per hub one read (``READ_BATCH`` events
per shard) and, for ``include_docs``, ``DOCS_PER_FETCH`` documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Set

from twisted.internet import defer, task

from cache.feed.live_queries import LiveQuery
from cache.feed.nudges import FeedNudges
from cache.feed.position import Position, StreamId
from cache.feed.streams import FeedReader
from cache.redis.address import RedisAddress
from handlers.feed.event_stream import EventStream
from handlers.feed.hub import Hub
from handlers.feed.stats import FeedStats
from handlers.feed.subscriber import Subscription

TICK_SECONDS = 1.0
SWEEP_TICKS = 2
IDLE_SECONDS = 30.0


@dataclass(frozen=True)
class FeedLimits:
    """The settings the serving side of the feed works by (``api.config``)."""

    buffer: int = 1024 * 1024
    stall_seconds: float = 30.0
    max_wait: int = 60
    # A live query's stream sends its place (an id-only event) once this many events passed it by: under half
    # of what a shard's stream keeps (JETWAY_FEED_MAX_EVENTS / 16), so a reconnect never finds it trimmed.
    id_every: int = 1000


class Feed:
    """The change feed of one worker."""

    def __init__(self, reader: FeedReader, nudges: Optional[FeedNudges], clock: Any, limits: FeedLimits) -> None:
        self.reader = reader
        self.clock = clock
        self.limits = limits
        self.stats = FeedStats()
        self.hubs: Dict[bytes, Hub] = {}
        self.streams: Set[EventStream] = set()
        self.draining = False
        self.nudges = nudges
        self._ticks = 0
        self._ticking = task.LoopingCall(self._tick)
        self._ticking.clock = clock
        self._ticking.start(TICK_SECONDS, now=False)

    @classmethod
    def connected(
        cls, reader: FeedReader, address: RedisAddress, reactor: Any, timeout: float, limits: FeedLimits
    ) -> Feed:
        """A feed with its nudge subscription to ``address``."""
        feed = cls(reader, None, reactor, limits)
        feed.nudges = FeedNudges(address, reactor, timeout, feed.nudged, feed.resubscribed)
        return feed

    def hub(self, collection: bytes) -> Hub:
        hub = self.hubs.get(collection)
        if hub is None or hub.closed:
            assert self.nudges is not None
            hub = self.hubs[collection] = Hub(collection, self.reader, self.nudges, self.clock)
        return hub

    def subscription(self, collection: bytes, with_docs: bool, live: Optional[LiveQuery] = None) -> Subscription:
        return Subscription(self.hub(collection), with_docs, self.limits.buffer, self.clock, live, self.limits.id_every)

    def stream_opened(self, stream: EventStream) -> None:
        self.streams.add(stream)
        self.stats.subscribers += 1

    def stream_closed(self, stream: EventStream) -> None:
        if stream in self.streams:
            self.streams.discard(stream)
            self.stats.subscribers -= 1

    def now(self, collection: bytes) -> defer.Deferred:
        """The feed's current position (where a follower from now starts)."""
        hub = self.hubs.get(collection)
        if hub is not None and hub.ready:
            return defer.succeed(hub.position)
        return self.reader.tail(collection)

    @defer.inlineCallbacks
    def poll(
        self,
        collection: bytes,
        position: Position,
        limit: int,
        wait: float,
        stop: Optional[defer.Deferred] = None,
        per_shard: Optional[int] = None,
    ) -> Any:
        """A long poll: the events after ``position``, waiting up to ``wait`` seconds for one, or until ``stop``."""
        page = yield self.reader.page(collection, position, limit, check_all=True, per_shard=per_shard)
        if page.events or page.lost or wait <= 0 or self.draining:
            return page
        hub = self.hub(collection)
        yield hub.when_ready()
        woken = yield hub.wait_past(position, wait, stop)
        if woken and not self.draining:
            page = yield self.reader.page(collection, position, limit, check_all=True, per_shard=per_shard)
        return page

    def nudged(self, collection: bytes, shard: int, stream_id: StreamId) -> None:
        hub = self.hubs.get(collection)
        if hub is not None:
            hub.nudge(shard, stream_id)

    def resubscribed(self) -> None:
        """Nudges sent while the subscription was down are gone: read everything followed."""
        for hub in self.hubs.values():
            hub.refresh()

    def drain(self) -> None:
        """End every stream with ``reconnect`` and answer every long poll (the worker stops)."""
        self.draining = True
        for stream in list(self.streams):
            stream.end_reconnect("the server is shutting down; reconnect with Last-Event-ID")
        for hub in self.hubs.values():
            hub.end_polls()

    def close(self) -> defer.Deferred:
        if self._ticking.running:
            self._ticking.stop()
        for hub in self.hubs.values():
            hub.close()
        return self.nudges.close() if self.nudges is not None else defer.succeed(None)

    def _tick(self) -> None:
        now = self.clock.seconds()
        for stream in list(self.streams):
            stream.tick(now)
        self._ticks += 1
        if self._ticks % SWEEP_TICKS:
            return
        for collection, hub in list(self.hubs.items()):
            if hub.busy:
                hub.last_busy = now
                hub.sweep()
            elif now - hub.last_busy >= IDLE_SECONDS:
                hub.close()
                del self.hubs[collection]
