"""One collection's change feed as one worker follows it, for all its subscribers there.

A ``Hub`` reads the collection's shard streams (``cache.feed.streams``) from
where it last was (``position``) whenever a nudge says a shard has more
(``cache.feed.nudges``), when its subscription comes back, and on the
worker's sweep; it never blocks a Redis connection. Each read's events are
merged in stream-id order, given their position token once, and made into
SSE frames once, and every live subscriber gets the same bytes in one
write (``Chunk``): the cost of an event is paid once per worker, and a
subscriber costs a write per batch. A live query's subscribers get the
frames of its own events, made from the chunk's events once per live query
(``Chunk.judged``), whatever the number of its subscribers.

Two lanes: ``plain`` (op, id, etag, time) and ``docs`` (the same with the
document's bytes as they are now, fetched once per batch for all the
``include_docs`` subscribers, ``DOCS_PER_FETCH`` at a time, in order). A
lane's ``position`` is where its last chunk ended; a subscriber catching
up joins a lane exactly there (``handlers.feed.subscriber``).

Consistency: a lane delivers each shard's events in stream order, once,
and a chunk's events in stream-id order. If a read finds that events after
the hub's position are gone (the cap, a failover that lost writes) it
cannot go on without a gap: every subscriber is told ``lost``, and the hub
starts again from the tail.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Set, Tuple

from twisted.internet import defer
from twisted.logger import Logger

from cache.feed.live_queries import LiveIndex, LiveQuery
from cache.feed.nudges import FeedNudges
from cache.feed.position import START, Position, StreamId, advanced, ahead, encode
from cache.feed.streams import Event, FeedReader, ShardRead, merged
from cache.keys import INDEX_SHARDS

# Events read per shard at once; a busier shard is read again at once.
READ_BATCH = 500
# Events delivered per reactor turn (a read's are delivered in order, in turns of this many).
DISPATCH_SLICE = 500
# Documents fetched per round trip for the docs lane: at most this many
# (each up to JETWAY_MAX_BODY) are held at once for a batch.
DOCS_PER_FETCH = 32
# Between retries while Redis does not answer a hub's read.
RETRY_SECONDS = 1.0
_log = Logger()

# (event, its position token, the position after it)
Entry = Tuple[Event, bytes, Position]


def sse_frame(token: bytes, data: bytes) -> bytes:
    """One SSE event: its position as ``id:`` (what ``Last-Event-ID`` resumes from), its JSON as ``data:``.

    A stored document may hold line breaks (JSON whitespace), which would
    end the ``data:`` line: each becomes a new ``data:`` line, which the
    client joins with ``\\n``, so it reads the same JSON (with CR and CRLF
    read as LF; the long poll sends the bytes exactly).
    """
    if b"\n" in data or b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\ndata: ")
    return b"id: " + token + b"\ndata: " + data + b"\n\n"


# A chunk's event, its position token, and its document (the docs lane's; None on the plain lane).
Framed = Tuple[Event, bytes, Optional[bytes]]
# A live query's frames of a chunk, how many events they are, and how many of the chunk's follow its last.
Judged = Tuple[bytes, int, int]


class Chunk:
    """The SSE frames of one batch, shared by every subscriber of a lane; and their events, for a live query's
    subscriber to frame the ones that are its own (``handlers.feed.subscriber``)."""

    __slots__ = ("_chunked", "_index", "_judged", "count", "events", "frames", "position")

    def __init__(
        self,
        frames: bytes,
        position: Position,
        count: int,
        events: Sequence[Framed] = (),
        index: Optional[LiveIndex] = None,
    ) -> None:
        self.frames = frames
        self.position = position
        self.count = count
        self.events = events
        self._index = index  # the live queries of the lane when the chunk was made
        self._chunked: Optional[bytes] = None
        self._judged: Optional[Dict[LiveQuery, Judged]] = None

    def judged(self, live: LiveQuery, with_docs: bool) -> Judged:
        """The frames of the events that are ``live``'s own, each with ``matches``, how many, and how many of
        the chunk's events follow its last own one: made once per live query for all its subscribers on the
        lane, and for all the lane's live queries in one pass over the events (``live_queries.LiveIndex``)."""
        if self._judged is None:
            self._judged = self._judge_all(with_docs)
        made = self._judged.get(live)
        if made is None:  # a query that joined the lane after the chunk was made: judged on its own
            own = [(n, live.judge(event)) for n, (event, _, _) in enumerate(self.events)]
            made = self._judged[live] = self._framed([(n, m) for n, m in own if m is not None], with_docs, live)
        return made

    def _judge_all(self, with_docs: bool) -> Dict[LiveQuery, Judged]:
        if self._index is None:
            return {}
        own: Dict[LiveQuery, List[Tuple[int, bool]]] = {query: [] for query in self._index.queries}
        for n, (event, _, _) in enumerate(self.events):
            for query, matches in self._index.judge(event).items():
                own[query].append((n, matches))
        return {query: self._framed(events, with_docs, query) for query, events in own.items()}

    def _framed(self, own: List[Tuple[int, bool]], with_docs: bool, live: LiveQuery) -> Judged:
        frames = []
        for n, matches in own:
            event, token, doc = self.events[n]
            frames.append(sse_frame(token, event.json(with_docs, live.shows(doc), matches)))
        after = len(self.events) - 1 - own[-1][0] if own else len(self.events)
        return b"".join(frames), len(frames), after

    def last_id(self) -> bytes:
        """An SSE event with only an ``id:``, the position after the chunk: a client's ``EventSource`` keeps it
        as its last event id and dispatches nothing (for a live query's passed-over events)."""
        return b"id: " + self.events[-1][1] + b"\n\n" if self.events else b""

    def chunked(self) -> bytes:
        """The frames as one HTTP/1.1 chunk, made once for all subscribers."""
        if self._chunked is None:
            self._chunked = b"%x\r\n%s\r\n" % (len(self.frames), self.frames)
        return self._chunked


class Member(Protocol):
    """What a lane delivers to (``handlers.feed.subscriber.Subscription``)."""

    def deliver(self, chunk: Chunk) -> None: ...

    def buffer(self, chunk: Chunk) -> None: ...

    def lost(self) -> None: ...

    def interrupted(self) -> None: ...


class Lane:
    """Subscribers that get the same frames, and where the last chunk ended."""

    def __init__(self, position: Position) -> None:
        self.position = position
        self.members: Set[Member] = set()
        self.joining: Set[Member] = set()  # catching up: chunks are buffered for them
        self._live: Dict[LiveQuery, int] = {}  # the live queries of its subscriptions, and how many have each
        self._index: Optional[LiveIndex] = None

    def follow(self, live: LiveQuery) -> None:
        """A subscription of ``live`` joined the lane: its chunks judge their events for it too."""
        self._live[live] = self._live.get(live, 0) + 1
        if self._live[live] == 1:
            self._index = None

    def unfollow(self, live: LiveQuery) -> None:
        left = self._live.get(live, 0) - 1
        if left > 0:
            self._live[live] = left
        elif live in self._live:
            del self._live[live]
            self._index = None

    def live_index(self) -> Optional[LiveIndex]:
        """The lane's live queries as one index, made again only when a distinct query came or went."""
        if self._index is None and self._live:
            self._index = LiveIndex(self._live)
        return self._index

    @property
    def busy(self) -> bool:
        return bool(self.members or self.joining)

    def deliver(self, chunk: Chunk) -> None:
        self.position = chunk.position
        for member in list(self.members):
            member.deliver(chunk)
        for member in list(self.joining):
            member.buffer(chunk)

    def everyone(self) -> List[Member]:
        return [*self.members, *self.joining]


class Hub:
    """One collection followed by this worker: its position, its lanes, its long polls."""

    def __init__(self, collection: bytes, reader: FeedReader, nudges: FeedNudges, clock: Any) -> None:
        self.collection = collection
        self.reader = reader
        self._nudges = nudges
        self._clock = clock
        self.position: Position = START
        self.plain = Lane(START)
        self.docs = Lane(START)
        self.ready = False
        self.closed = False
        self.events_read = 0
        self.attached = 0  # subscriptions of this hub, live or catching up
        self.last_busy = clock.seconds()
        self._starting: List[defer.Deferred] = []
        self._dirty: Set[int] = set()
        self._reading = False
        self._scheduled: Optional[Any] = None
        self._reads_started = 0
        self._settling: List[Tuple[int, defer.Deferred]] = []
        self._docs_chain: defer.Deferred = defer.succeed(None)
        self._polls: List[Tuple[Position, defer.Deferred, Any]] = []

    # -- life ------------------------------------------------------------

    def when_ready(self) -> defer.Deferred:
        """Fires once the hub knows where the feed is (subscribed, then the tail read)."""
        if self.ready:
            return defer.succeed(self)
        waiting: defer.Deferred = defer.Deferred()
        self._starting.append(waiting)
        if len(self._starting) == 1:
            self._start()
        return waiting

    def _start(self) -> None:
        # Subscribed before the tail is read: an event after the tail has
        # its nudge coming (or the sweep finds it).
        starting = self._nudges.follow(self.collection)
        starting.addCallback(lambda _: self.reader.tail(self.collection))
        starting.addCallbacks(self._started, self._not_started)

    def _started(self, tail: Position) -> None:
        self.position = tail
        self.plain.position = self.docs.position = tail
        self._dirty.clear()
        self.ready = True
        starting, self._starting = self._starting, []
        for waiting in starting:
            waiting.callback(self)

    def _not_started(self, failure: Any) -> None:
        starting, self._starting = self._starting, []
        for waiting in starting:
            waiting.errback(failure)

    @property
    def busy(self) -> bool:
        return bool(self.attached or self._polls or self._starting)

    def close(self) -> None:
        """Stop following (no subscriber left for a while)."""
        self.closed = True
        self._nudges.unfollow(self.collection)
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()

    # -- reading -----------------------------------------------------------

    def nudge(self, shard: int, stream_id: StreamId) -> None:
        """A write script says ``shard`` has ``stream_id``: read it, unless already read."""
        if self.ready and stream_id > self.position[shard]:
            self._dirty.add(shard)
            self._schedule()

    def refresh(self) -> None:
        """Read every shard from where the hub is (the subscription came back)."""
        if self.ready:
            self._dirty.update(range(INDEX_SHARDS))
            self._schedule()

    def sweep(self) -> None:
        """The safety net for lost nudges: read the shards whose tail moved."""
        if self.ready and not self._reading and not self._dirty:
            self.reader.tail(self.collection).addCallbacks(self._swept, lambda _: None)

    def _swept(self, tail: Position) -> None:
        moved = ahead(tail, self.position)
        if moved and not self.closed:
            self._dirty.update(moved)
            self._schedule()

    def settled(self, with_docs: bool) -> defer.Deferred:
        """Fires once every shard was read to its end after now, and the lane has delivered it."""
        settling: defer.Deferred = defer.Deferred()
        self._settling.append((self._reads_started + 1, settling))
        self.refresh()
        if with_docs:
            settling.addCallback(lambda _: self._after_docs())
        return settling

    def _after_docs(self) -> defer.Deferred:
        done: defer.Deferred = defer.Deferred()
        self._docs_chain.addBoth(lambda result: (done.callback(None), result)[1])
        return done

    def _schedule(self) -> None:
        # Nudges of one reactor turn make one read.
        if self._scheduled is None and not self._reading and not self.closed and self.ready:
            self._scheduled = self._clock.callLater(0, self._read)

    def _read(self) -> None:
        self._scheduled = None
        if self._reading or not self._dirty or self.closed or not self.ready:
            return
        self._reading = True
        self._reads_started += 1
        number = self._reads_started
        shards = sorted(self._dirty)
        self._dirty.clear()
        reading = self.reader.read(
            self.collection, [(shard, self.position[shard], None, READ_BATCH) for shard in shards]
        )
        reading.addCallbacks(self._read_done, self._read_failed, callbackArgs=(number,), errbackArgs=(shards,))

    def _read_done(self, reads: List[ShardRead], number: int) -> None:
        self._reading = False
        if self.closed:
            return
        if any(read.lost for read in reads):
            self._lose()
            return
        events = merged(reads)
        full = [read.events[-1].stream_id for read in reads if read.full]
        if full:
            # A shard read to READ_BATCH may hold events older than the
            # other shards' last ones: deliver up to there, read on.
            cutoff = min(full)
            self._dirty.update(read.shard for read in reads if read.full)
            self._dirty.update(event.shard for event in events if event.stream_id > cutoff)
            events = [event for event in events if event.stream_id <= cutoff]
        self._reading = True  # until its events are delivered
        self._dispatch_slices(events, number)

    def _dispatch_slices(self, events: List[Event], number: int) -> None:
        """A read's events, ``DISPATCH_SLICE`` a reactor turn: the lanes' live queries are judged per chunk, and
        a read of 8,000 events in one turn held the worker, ``/healthz`` included, with 2,000 distinct queries
        (issue #55 item 6; loadtest/studies/_live_fanout.py measures it: docs/history/performance.md,
        "The change feed")."""
        if self.closed:
            self._reading = False
            return
        self._dispatch(events[:DISPATCH_SLICE])
        if len(events) > DISPATCH_SLICE:
            self._clock.callLater(0, self._dispatch_slices, events[DISPATCH_SLICE:], number)
            return
        self._reading = False
        if self._dirty:
            self._schedule()
            return
        settled = [waiting for needed, waiting in self._settling if needed <= number]
        self._settling = [(needed, waiting) for needed, waiting in self._settling if needed > number]
        for waiting in settled:
            waiting.callback(None)

    def _read_failed(self, failure: Any, shards: List[int]) -> None:
        self._reading = False
        self._dirty.update(shards)
        _log.warn("change feed of {collection} not read: {error}", collection=self.collection, error=failure.value)
        settling, self._settling = self._settling, []
        for _, waiting in settling:
            waiting.errback(failure)
        if not self.closed:
            self._clock.callLater(RETRY_SECONDS, self._schedule)

    # -- delivering --------------------------------------------------------

    def _dispatch(self, events: List[Event]) -> None:
        if not events:
            return
        self.events_read += len(events)
        position = self.position
        entries: List[Entry] = []
        for event in events:
            position = advanced(position, event.shard, event.stream_id)
            entries.append((event, encode(self.collection, position).encode("ascii"), position))
        self.position = position
        frames = b"".join([sse_frame(token, event.json()) for event, token, _ in entries])
        framed = [(event, token, None) for event, token, _ in entries]
        self.plain.deliver(Chunk(frames, position, len(entries), framed, self.plain.live_index()))
        self._docs_chain.addCallback(self._docs_step, entries)
        self._wake_polls()

    def _docs_step(self, _: Any, entries: List[Entry]) -> Optional[defer.Deferred]:
        if not self.docs.busy or self.closed:
            self.docs.position = entries[-1][2]
            return None
        return self._fetch_docs(entries, 0)

    def _fetch_docs(self, entries: List[Entry], start: int) -> defer.Deferred:
        part = entries[start : start + DOCS_PER_FETCH]
        ids = list(dict.fromkeys(event.doc_id for event, _, _ in part))
        fetching = self.reader.documents(self.collection, ids)
        fetching.addCallback(self._docs_fetched, entries, start, ids)
        return fetching.addErrback(self._docs_failed, entries)

    def _docs_fetched(self, bodies: List[Optional[bytes]], entries: List[Entry], start: int, ids: List[bytes]) -> Any:
        docs = dict(zip(ids, bodies))
        part = entries[start : start + DOCS_PER_FETCH]
        framed = [(event, token, docs[event.doc_id]) for event, token, _ in part]
        frames = b"".join([sse_frame(token, event.json(True, doc)) for event, token, doc in framed])
        self.docs.deliver(Chunk(frames, part[-1][2], len(part), framed, self.docs.live_index()))
        if start + DOCS_PER_FETCH < len(entries):
            return self._fetch_docs(entries, start + DOCS_PER_FETCH)
        return None

    def _docs_failed(self, failure: Any, entries: List[Entry]) -> None:
        # Their next frames would skip events: they reconnect and resume from their last id.
        _log.warn("documents of {collection}'s feed not read: {error}", collection=self.collection, error=failure.value)
        for member in self.docs.everyone():
            member.interrupted()
        self.docs.position = entries[-1][2]

    def _lose(self) -> None:
        """Events after the hub's position are gone: nobody can be told what they were."""
        for member in [*self.plain.everyone(), *self.docs.everyone()]:
            member.lost()
        self._wake_polls(everyone=True)
        self.ready = False
        self.when_ready().addErrback(lambda _: None)  # from the tail again; on failure the next subscriber retries

    # -- long polls --------------------------------------------------------

    def wait_past(self, position: Position, seconds: float, stop: Optional[defer.Deferred] = None) -> defer.Deferred:
        """Fires True once the hub has read past ``position`` in any shard, False after ``seconds`` or on ``stop``."""
        if ahead(self.position, position):
            return defer.succeed(True)
        waiting: defer.Deferred = defer.Deferred()
        timer = self._clock.callLater(seconds, self._poll_timed_out, waiting)
        self._polls.append((position, waiting, timer))
        if stop is not None:
            stop.addCallback(self._poll_stopped, waiting)
        return waiting

    def end_polls(self) -> None:
        """Answer every long poll now (the worker drains)."""
        self._wake_polls(everyone=True)

    def _poll_stopped(self, result: Any, waiting: defer.Deferred) -> Any:
        """The poll's credential died (``handlers.changes``): it answers now, its timer goes."""
        for poll in self._polls:
            if poll[1] is waiting:
                self._polls.remove(poll)
                poll[2].cancel()
                waiting.callback(False)
                break
        return result

    def _poll_timed_out(self, waiting: defer.Deferred) -> None:
        self._polls = [poll for poll in self._polls if poll[1] is not waiting]
        self.last_busy = self._clock.seconds()
        waiting.callback(False)

    def _wake_polls(self, everyone: bool = False) -> None:
        if not self._polls:
            return
        woken = [poll for poll in self._polls if everyone or ahead(self.position, poll[0])]
        self._polls = [poll for poll in self._polls if poll not in woken]
        for _, waiting, timer in woken:
            if timer.active():
                timer.cancel()
            waiting.callback(True)


HubFactory = Callable[[bytes], Hub]
