"""The connection's streamed bodies and streamed answers (``api.connection`` mixes this in).

An operation whose table entry declares its body streamed
(``handlers.operation.STREAMED_BODY``: the NDJSON import,
``handlers.imports``) takes its body as it arrives, not whole. Its request is
dispatched at its head; what the socket brings is handed to the request's
``BodyStream`` (``handlers.http.body_stream``), and the connection stops
reading while the stream is full, so the input it holds is bounded
whatever the body's size. A streamed body has a deadline, not only an idle
timeout: it gets its 408 when no byte came for the body timeout, and also
when its average rate falls short, as Apache's ``mod_reqtimeout`` rules
it: the deadline is ``body_timeout`` seconds after its start plus a second
for every ``body_min_rate`` bytes received, plus the time its handler held
it up (then the clock stops: the client is not the one waiting). So a
steady upload goes on for as long as it takes, and one that trickles is
cut within the body timeout of falling behind; what it reserved of the
worker's body budget (streamed bodies have a share of their own,
``api.body_budget``) comes back when it ends. A request answered before
its body ended closes the connection.

A handler that streams its answer (the NDJSON export, ``handlers.exports``)
writes a part, then waits for ``when_drained`` before making the next.

Every attribute used here is the connection's (``JetwayConnection``).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

from twisted.internet import defer

from api.chunked import ChunkedDecoder
from api.request_head import ProtocolError, RequestHead
from handlers.http.body_stream import BodyStream
from handlers.http.errors import ApiError

# What a streamed body holds before the connection stops reading: the
# handler's line splitter holds at most a line more (max_body).
STREAM_HOLD = 64 * 1024
STREAM_TIMEOUT_DETAIL = "the request's body stopped arriving, or came slower than the server's minimum rate"


def stream_reservation(max_body: int) -> int:
    """What a streamed body reserves of the worker's body budget: what its stream and line splitter may hold."""
    return 2 * STREAM_HOLD + max_body


class StreamClock:
    """A streamed body's deadline: idle for the body timeout, or behind its minimum rate (see the module)."""

    def __init__(self, now: float, timeout: float, min_rate: int) -> None:
        self.timeout = timeout
        self.min_rate = min_rate
        self.started = now
        self.received = 0
        self.held_since: Optional[float] = None  # the handler holds the body up since then
        self.held_for = 0.0

    def arrived(self, size: int) -> None:
        self.received += size

    def held(self, now: float) -> None:
        if self.held_since is None:
            self.held_since = now

    def freed(self, now: float) -> None:
        if self.held_since is not None:
            self.held_for += now - self.held_since
            self.held_since = None

    def seconds_left(self, now: float) -> float:
        """Until the 408, counted from ``now`` (a byte just came, or the handler just took what it held)."""
        by_rate = self.started + self.timeout + self.held_for + self.received / self.min_rate
        return max(0.0, min(self.timeout, by_rate - now))


class StreamedBody:
    """The connection's part that streams a body in, or an answer out."""

    _stream: Optional[BodyStream]
    _drained: Optional[defer.Deferred]
    _chunks: Optional[ChunkedDecoder]
    _stream_left: int
    _stream_clock: StreamClock
    _stream_keep_alive: bool
    _buffer: bytearray
    _lost: bool
    _output_blocked: bool
    current_request: Any
    transport: Any
    factory: Any
    limits: Any
    keep_alive: bool

    def when_drained(self) -> defer.Deferred:
        """Fires True once the output queued now is sent (at once if none is), False if the connection is lost.

        For a handler that streams its answer: it writes a part, then waits
        for this before making the next, so the worker holds about one part
        per client however slowly it reads (Twisted pauses the connection,
        the transport's producer, past ``READ_SIZE`` queued, and resumes it
        once all of it is sent). A client that takes nothing for the send
        timeout is aborted (then this fires False).
        """
        if self._lost:
            return defer.succeed(False)
        if not self._output_blocked:
            return defer.succeed(True)
        self._arm_send_abort()
        self._drained = defer.Deferred()
        return self._drained

    def _fire_drained(self, sent: bool) -> None:
        drained, self._drained = self._drained, None
        if drained is not None:
            if sent:
                self._disarm()
            drained.callback(sent)

    def _start_stream(self, head: RequestHead, routed: Any) -> None:
        """Dispatch an import at its head: its body goes to the handler as it arrives (``BodyStream``).

        The worker's body budget holds what the stream and the handler's
        line splitter may hold, not the body's size, which is unbounded.
        """
        self._reserve_body(stream_reservation(self.limits.max_body), streamed=True)
        self._stream_clock = StreamClock(
            self.factory.clock.seconds(), self.limits.body_timeout, self.limits.body_min_rate
        )
        self._chunks = ChunkedDecoder(sys.maxsize) if head.chunked else None
        self._stream_left = head.content_length
        self._stream = BodyStream(STREAM_HOLD, self._stream_room)
        if head.expects_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._dispatch(head, b"", routed, self._stream)
        if self._stream is not None:
            self._feed_stream()

    def _feed_stream(self) -> None:
        """Hand the stream what the buffer holds of its body; stop reading while it is full."""
        stream = self._stream
        assert stream is not None and self.current_request is not None
        try:
            data, done = self._stream_data()
        except ProtocolError as error:
            self._end_stream(ApiError(error.status, error.problem, error.detail))
            return
        if data:
            self._stream_clock.arrived(len(data))
            self._arm_stream()  # steady progress keeps a slow upload going
            stream.feed(data)  # the handler may answer in there, ending the stream
        if self._stream is not stream:
            return
        if done:
            self._stream = self._chunks = None
            self.keep_alive = self._stream_keep_alive
            self._disarm()
            self.transport.pauseProducing()  # what follows is the next request: it waits for this answer
            stream.finish()
        elif not stream.has_room():
            self._disarm()  # the handler holds the body up, not the client
            self._stream_clock.held(self.factory.clock.seconds())
            self.transport.pauseProducing()

    def _arm_stream(self) -> None:
        self._arm(self._stream_clock.seconds_left(self.factory.clock.seconds()), 408)

    def _stream_data(self) -> Tuple[bytes, bool]:
        """What the buffer holds of the streamed body, taken from it; and whether the body ended."""
        if self._chunks is not None:
            done = self._chunks.feed(self._buffer)
            return self._chunks.take(), done
        size = min(self._stream_left, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._stream_left -= size
        return data, not self._stream_left

    def _stream_room(self) -> None:
        """The handler took what the stream held: read on."""
        if self._stream is None or self._lost:
            return
        self._stream_clock.freed(self.factory.clock.seconds())
        self._arm_stream()
        if not self._output_blocked:
            self.transport.resumeProducing()

    def _end_stream(self, error: Exception) -> None:
        """The streamed body will not arrive whole: its handler's next read raises ``error``."""
        stream, self._stream, self._chunks = self._stream, None, None
        if stream is not None:
            self._buffer = bytearray()
            stream.fail(error)
