"""A Server-Sent Events response: its framing, heartbeats and bounded output.

Every other response of the API has a ``Content-Length``; a stream has no
end known in advance, so it is sent as HTTP/1.1 chunks written here (each
batch one chunk, made once per lane and shared, ``handlers.feed.hub.Chunk``),
or, to an HTTP/1.0 client, delimited by closing the connection.

The connection's own back-pressure (``api.connection``) bounds what a
client holds between requests; during a stream the stream bounds it: what
the client has not taken and the kernel did not accept stays queued in the
worker, and once that exceeds ``limit`` after a write that found some
already queued, the client is sent ``fell-behind`` and the connection
closes. (A batch written to an empty queue always goes, so one large
document cannot end a stream by itself.) Output that makes no progress
for ``stall_seconds`` ends the stream too, so a client that stops reading
holds at most ``limit`` for that long.

Named events a client may see besides the changes (``data`` says more):
``ready`` (first, with the position it starts from), ``fell-behind``,
``lost`` (events after its position are gone: re-list, then follow from
a new position), ``reconnect`` (the server is shutting down, or could not
read the feed: reconnect with ``Last-Event-ID``), ``unauthorized`` (the
stream's credential died: ``reason`` is ``token-revoked``,
``token-expired`` or ``ticket-expired``, ``cache.credentials.watch``; a
reconnect needs a valid token or a new ticket). Only ``ready`` and the
changes carry an ``id:`` (and, for a live query, events with an ``id:``
alone: its place past events that were not its own), so a reconnect
resumes after the last change.
"""

from __future__ import annotations

from typing import Any, Callable

from cache.json import codec
from cache.twisted_internals import unsent_bytes
from handlers.feed.hub import Chunk
from handlers.feed.stats import FeedStats

# What a browser's EventSource waits before reconnecting (its own default is
# a few seconds): a graceful restart should cost a client less than a second.
RETRY_MS = 500
HEARTBEAT_SECONDS = 15.0
_HEARTBEAT = b": keep-alive\n\n"
_LAST_CHUNK = b"0\r\n\r\n"
LOST_DETAIL = (
    "events after this position are no longer kept (the feed's cap, or a failover lost them):"
    " re-list the collection, then follow from a new position"
)


def named_event(name: bytes, fields: dict) -> bytes:
    return b"event: " + name + b"\ndata: " + codec.dumps(fields) + b"\n\n"


def ready_event(token: str) -> bytes:
    """The first event: the reconnect delay, and the position (also as ``id:``, so a reconnect resumes there)."""
    data = codec.dumps({"position": token})
    return b"retry: %d\nid: %s\nevent: ready\ndata: %s\n\n" % (RETRY_MS, token.encode("ascii"), data)


def queued_bytes(transport: Any) -> int:
    """What the transport holds that the kernel did not take yet (Twisted's write buffer)."""
    return unsent_bytes(transport)


class EventStream:
    """One client's SSE response, once its head is written (``handlers.changes``)."""

    def __init__(
        self,
        transport: Any,
        chunked: bool,
        limit: int,
        stall_seconds: float,
        clock: Any,
        stats: FeedStats,
        on_end: Callable[[], None],
    ) -> None:
        self.transport = transport
        self.chunked = chunked
        self.limit = limit
        self.stall_seconds = stall_seconds
        self.clock = clock
        self.stats = stats
        self.on_end = on_end
        self.closed = False
        self.last_write = clock.seconds()
        self._stalled_since = None
        self._queued_seen = 0
        # A live query's position past events it passed over, not yet sent (``handlers.feed.subscriber``).
        self.pending_id = b""

    def open(self, head: bytes, first: bytes) -> None:
        self.transport.write(head + self._framed(first))
        self.last_write = self.clock.seconds()

    def deliver(self, chunk: Chunk) -> None:
        self._write(chunk.chunked() if self.chunked else chunk.frames, chunk.count)

    def send(self, frames: bytes, count: int) -> None:
        if frames:
            self._write(self._framed(frames), count)

    def queued(self) -> int:
        return queued_bytes(self.transport)

    def tick(self, now: float) -> None:
        """Each second (``handlers.feed.feed``): a heartbeat when quiet, and the end when stalled."""
        if self.closed:
            return
        queued = self.queued()
        if queued and queued >= self._queued_seen:
            if self._stalled_since is None:
                self._stalled_since = now
            elif now - self._stalled_since >= self.stall_seconds:
                self.fell_behind()
                return
        else:
            self._stalled_since = None
        self._queued_seen = queued
        if now - self.last_write >= HEARTBEAT_SECONDS:
            self._write(self._framed(self.pending_id + _HEARTBEAT), 0)
            self.pending_id = b""

    def fell_behind(self) -> None:
        self.stats.fell_behind += 1
        detail = "the client did not read fast enough; reconnect with Last-Event-ID"
        self.end(named_event(b"fell-behind", {"detail": detail}))

    def end_lost(self) -> None:
        self.stats.lost += 1
        self.end(named_event(b"lost", {"detail": LOST_DETAIL}))

    def end_reconnect(self, reason: str) -> None:
        self.end(named_event(b"reconnect", {"detail": reason}))

    def end_unauthorized(self, reason: str, detail: str) -> None:
        """The stream's token or ticket is no longer valid (``handlers.changes``)."""
        self.end(named_event(b"unauthorized", {"reason": reason, "detail": detail}))

    def end(self, final: bytes = b"") -> None:
        """The last event (if any), the end of the chunked body, and the connection closes."""
        if self.closed:
            return
        self.closed = True
        tail = self._framed(final) if final else b""
        self.transport.write(tail + (_LAST_CHUNK if self.chunked else b""))
        self.on_end()

    def connection_lost(self) -> None:
        self.closed = True

    def _write(self, data: bytes, count: int) -> None:
        if self.closed:
            return
        backlog = self.queued()
        self.transport.write(data)
        self.last_write = self.clock.seconds()
        self.stats.events_sent += count
        if backlog and self.queued() > self.limit:
            self.fell_behind()

    def _framed(self, data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data
