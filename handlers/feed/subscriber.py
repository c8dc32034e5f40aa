"""One SSE subscriber: from its position (or now) to live, without a gap or a repeat.

A subscriber that resumes (``Last-Event-ID``, ``?since=``) is behind its
hub's lane. It reads pages from Redis itself, bounded by where the lane is
(``target``), and sends them; when a page ends exactly at ``target`` it
becomes a lane member. The lane goes on delivering while that page is read,
so the subscriber joins the lane *as the read is sent* and the lane's
chunks after ``target`` are buffered for it (at most the subscriber's
buffer limit; beyond it the buffer is dropped and it reads on), then sent
after the page: each shard's events in order, each once.

A position ahead of the lane in some shard (the client came from a worker
that had read further) waits until the hub has read every shard to its end;
if it is still ahead then, the events it names are gone (``lost``).

Memory: a page is at most ``PAGE_SIZE`` events per shard, and the next is
read only once the client has taken the last (its queued output below half
its limit).

A live query's subscriber (``cache.feed.live_queries``) is a member of the same
lanes: it frames only the events that are its own, from the chunk's events,
each with ``"matches"``. The events it passes over move its position too:
once ``id_every`` of them followed its last ``id:``, at the end of a
catch-up page, and at a heartbeat, it sends an event with only an ``id:``
(an ``EventSource`` keeps it as its last event id and dispatches nothing),
so a client that reconnects resumes past them: a rare filter on a busy
collection neither reads them again nor loses its place to the feed's cap
(issue #55 item 7).
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol

from twisted.internet import defer

from cache.feed.live_queries import LiveQuery
from cache.feed.position import Position, advanced, ahead, encode
from cache.feed.streams import Event, Page
from handlers.feed.hub import DOCS_PER_FETCH, Chunk, Hub, Lane, sse_frame

# Events per shard per page while catching up.
PAGE_SIZE = 200
# How often a catching-up subscriber looks whether its client took what it was sent.
DRAIN_POLL_SECONDS = 0.05
# Before looking again at a position still ahead of a settled hub (a race with a write).
AHEAD_RETRY_SECONDS = 0.1


class Sink(Protocol):
    """Where a subscription's frames go (``handlers.feed.event_stream.EventStream``)."""

    closed: bool
    pending_id: bytes  # an id-only event the next heartbeat sends (b"": none)

    def deliver(self, chunk: Chunk) -> None: ...

    def send(self, frames: bytes, count: int) -> None: ...

    def queued(self) -> int: ...

    def end_lost(self) -> None: ...

    def end_reconnect(self, reason: str) -> None: ...


class Subscription:
    """A client following ``hub``'s collection (``with_docs``: the docs lane)."""

    def __init__(
        self,
        hub: Hub,
        with_docs: bool,
        buffer_limit: int,
        clock: Any,
        live: Optional[LiveQuery] = None,
        id_every: int = 1000,
    ) -> None:
        self.hub = hub
        self.with_docs = with_docs
        self.live = live  # a live query's: only its events, each with "matches" (cache.feed.live_queries)
        self.lane: Lane = hub.docs if with_docs else hub.plain
        self.position: Position = hub.position
        self.buffer_limit = buffer_limit
        self.clock = clock
        self.sink: Optional[Sink] = None
        self.stopped = False
        self._joined_at: Optional[Position] = None
        self._buffered: List[Chunk] = []
        self._buffered_bytes = 0
        self.id_every = id_every
        self._passed = 0  # a live query's: events passed over since the last id: it sent
        hub.attached += 1
        if live is not None:
            self.lane.follow(live)

    @defer.inlineCallbacks
    def start(self, position: Optional[Position]) -> Any:
        """Fires with the first page to send (None from now); ``page.lost`` if the position is gone."""
        yield self.hub.when_ready()
        if position is None:
            self.position = self.lane.position
            return None
        self.position = position
        page = yield self._next_page(first=True)
        return page

    def run(self, sink: Sink, first: Optional[Page]) -> None:
        """Send ``first`` to ``sink``, then catch up and follow, until stopped."""
        self.sink = sink
        self._catch_up(first).addErrback(self._failed)

    def cancel(self) -> None:
        """The client went away, or its stream ended."""
        if not self.stopped:
            self.hub.attached -= 1
            if self.live is not None:
                self.lane.unfollow(self.live)
        self.stopped = True
        self._leave()
        self.lane.members.discard(self)

    # -- the lane's calls ---------------------------------------------------

    def deliver(self, chunk: Chunk) -> None:
        if self.sink is None:
            return
        if self.live is None:
            self.sink.deliver(chunk)
            return
        # The lane's frames are every event's: a live query's are made from the chunk's events, once per query.
        frames, count, after = chunk.judged(self.live, self.with_docs)
        self._passed = after if count else self._passed + after
        if self._passed:
            if self._passed >= self.id_every:
                frames, self._passed = frames + chunk.last_id(), 0
                self.sink.pending_id = b""
            else:
                self.sink.pending_id = chunk.last_id()
        else:
            self.sink.pending_id = b""
        self.sink.send(frames, count)

    def buffer(self, chunk: Chunk) -> None:
        self._buffered.append(chunk)
        self._buffered_bytes += len(chunk.frames)
        if self._buffered_bytes > self.buffer_limit:
            self._leave()  # too far behind to hold: read those from Redis instead

    def lost(self) -> None:
        if self.sink is not None:
            self.sink.end_lost()
        self.cancel()

    def interrupted(self) -> None:
        if self.sink is not None:
            self.sink.end_reconnect("the documents of the latest events could not be read")
        self.cancel()

    # -- catching up ------------------------------------------------------

    @defer.inlineCallbacks
    def _catch_up(self, page: Optional[Page]) -> Any:
        while not self.stopped:
            if page is None:
                page = yield self._next_page(first=False)
                if page is None:
                    continue
            if page.lost:
                self.lost()
                return
            yield self._send(page.events)
            if self.stopped:
                return
            if self._joined_at is not None and self.position == self._joined_at:
                self._go_live()
                return
            self._leave()
            page = None
            yield self._drained()

    @defer.inlineCallbacks
    def _next_page(self, first: bool) -> Any:
        """The next page up to the lane (joined as it is read); None to look again."""
        yield self.hub.when_ready()
        target = self.lane.position
        if ahead(self.position, target):
            yield self.hub.settled(self.with_docs)
            target = self.lane.position
            beyond = ahead(self.position, target)
            if beyond:
                checked = yield self.hub.reader.read(
                    self.hub.collection, [(shard, self.position[shard], None, 0) for shard in beyond]
                )
                if any(read.lost for read in checked):
                    return Page(True, [], self.position, False)
                yield _sleep(self.clock, AHEAD_RETRY_SECONDS)  # a write raced the settling: look again
                return None
        self._join(target)
        page = yield self.hub.reader.page(self.hub.collection, self.position, PAGE_SIZE, bound=target, check_all=first)
        return page

    def _join(self, target: Position) -> None:
        self._joined_at = target
        self._buffered = []
        self._buffered_bytes = 0
        self.lane.joining.add(self)

    def _leave(self) -> None:
        self.lane.joining.discard(self)
        self._joined_at = None
        self._buffered = []
        self._buffered_bytes = 0

    def _go_live(self) -> None:
        buffered = self._buffered
        self.lane.joining.discard(self)
        self._joined_at = None
        self._buffered = []
        self.lane.members.add(self)
        for chunk in buffered:
            self.deliver(chunk)

    @defer.inlineCallbacks
    def _send(self, events: List[Event]) -> Any:
        """Frames of a page, each with the position after it; documents fetched for the docs lane."""
        collection = self.hub.collection
        step = DOCS_PER_FETCH if self.with_docs else max(len(events), 1)
        for start in range(0, len(events), step):
            part = events[start : start + step]
            docs = {}
            if self.with_docs:
                ids = list(dict.fromkeys(event.doc_id for event in part))
                bodies = yield self.hub.reader.documents(collection, ids)
                docs = dict(zip(ids, bodies))
            if self.stopped or self.sink is None:
                return
            frames = []
            position = self.position
            passed = False
            for event in part:
                position = advanced(position, event.shard, event.stream_id)
                matches = None if self.live is None else self.live.judge(event)
                passed = self.live is not None and matches is None
                if passed:
                    continue  # not the live query's: its position goes with the next one's, or the page's id
                token = encode(collection, position).encode("ascii")
                doc = docs.get(event.doc_id)
                frames.append(
                    sse_frame(token, event.json(self.with_docs, self.live.shows(doc) if self.live else doc, matches))
                )
            if passed:
                frames.append(b"id: " + encode(collection, position).encode("ascii") + b"\n\n")
            self.position = position
            self._passed, self.sink.pending_id = 0, b""
            self.sink.send(b"".join(frames), len(frames) - passed)

    def _drained(self) -> defer.Deferred:
        """Fires once the client has taken most of what it was sent (or is gone)."""
        done: defer.Deferred = defer.Deferred()

        def look() -> None:
            if self.stopped or self.sink is None or self.sink.closed or self.sink.queued() <= self.buffer_limit // 2:
                done.callback(None)
            else:
                self.clock.callLater(DRAIN_POLL_SECONDS, look)

        look()
        return done

    def _failed(self, failure: Any) -> None:
        # Redis did not answer a catch-up read: the client reconnects and resumes.
        if self.sink is not None and not self.stopped:
            self.sink.end_reconnect("the feed could not be read; reconnect with Last-Event-ID")
        self.cancel()


def _sleep(clock: Any, seconds: float) -> defer.Deferred:
    sleeping: defer.Deferred = defer.Deferred()
    clock.callLater(seconds, sleeping.callback, None)
    return sleeping
