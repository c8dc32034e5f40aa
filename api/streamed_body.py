"""A request's body streamed in to its handler (the import), with its deadline by rate; an answer streamed out.

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
writes a part, then waits for the connection's ``when_drained`` (a
``Drain``) before making the next.

The connection (``api.connection``) owns a ``StreamedBody`` while such a
body arrives, and a ``Drain``; each holds its own state, and is given what
of the connection it acts on: its ``Deadline`` (``api.deadline``), and for
the body, how to pause and resume its reading.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Tuple

from twisted.internet import defer

from api.chunked import ChunkedDecoder
from api.deadline import ABORT, Deadline
from api.request_head import RequestHead
from handlers.http.body_stream import BodyStream

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
    """One request's body, handed to its handler's ``stream`` as it arrives, until it ends whole or ``fail``s.

    ``limits`` is the connection's ``api.connection.HttpLimits`` (not
    imported: that module imports this one), ``clock`` its reactor, and
    ``deadline`` its deadline, a 408 while the body arrives; ``pause()``
    stops its reading, ``resume()`` reads on (unless its client is not
    taking its output). ``keep_alive``: the connection's, once the body
    ended whole (answered before, it closes).
    """

    def __init__(
        self,
        head: RequestHead,
        limits: Any,
        clock: Any,
        deadline: Deadline,
        pause: Callable[[], None],
        resume: Callable[[], None],
    ) -> None:
        self.keep_alive = head.keep_alive
        self.stream = BodyStream(STREAM_HOLD, self._room)
        self.ended = False
        self._chunks = ChunkedDecoder(sys.maxsize) if head.chunked else None
        self._left = head.content_length  # its bytes still to come, by Content-Length
        self._clock = clock
        self._pace = StreamClock(clock.seconds(), limits.body_timeout, limits.body_min_rate)
        self._deadline = deadline
        self._pause = pause
        self._resume = resume

    def take(self, buffer: bytearray) -> bool:
        """Hand the handler what ``buffer`` holds of the body, taken from it; True when the body has ended whole.

        Stops the connection's reading while the stream is full. Raises
        ``ProtocolError`` for a malformed chunk.
        """
        data, done = self._taken(buffer)
        if data:
            self._pace.arrived(len(data))
            self._arm_deadline()  # steady progress keeps a slow upload going
            self.stream.feed(data)  # the handler may answer in there, ending the body
        if self.ended:
            return False
        if done:
            return True
        if not self.stream.has_room():
            self._deadline.disarm()  # the handler holds the body up, not the client
            self._pace.held(self._clock.seconds())
            self._pause()
        return False

    def finish(self) -> None:
        """The body ended whole: the connection reads no more (what follows is the next request: it waits for
        this answer), and the handler is told (it may answer in there)."""
        self.ended = True
        self._deadline.disarm()
        self._pause()
        self.stream.finish()

    def fail(self, error: Exception) -> None:
        """The body will not arrive whole: its handler's next read raises ``error``."""
        self.ended = True
        self.stream.fail(error)

    def _taken(self, buffer: bytearray) -> Tuple[bytes, bool]:
        """What ``buffer`` holds of the body, taken from it; and whether the body ended."""
        if self._chunks is not None:
            done = self._chunks.feed(buffer)
            return self._chunks.take(), done
        size = min(self._left, len(buffer))
        data = bytes(buffer[:size])
        del buffer[:size]
        self._left -= size
        return data, not self._left

    def _arm_deadline(self) -> None:
        self._deadline.arm(self._pace.seconds_left(self._clock.seconds()), 408)

    def _room(self) -> None:
        """The handler took what the stream held: read on."""
        if self.ended:
            return
        self._pace.freed(self._clock.seconds())
        self._arm_deadline()
        self._resume()


class Drain:
    """Waits for a connection's queued output to be sent, for a handler that streams its answer.

    The handler writes a part, then waits for this before making the next,
    so the worker holds about one part per client however slowly it reads
    (Twisted pauses the connection, the transport's producer, past
    ``READ_SIZE`` queued, and resumes it once all of it is sent). A client
    that takes nothing for ``send_timeout`` is aborted (then the wait fires
    False): the connection's ``deadline``, which its sent output disarms.
    """

    def __init__(self, deadline: Deadline, send_timeout: float) -> None:
        self._deadline = deadline
        self._send_timeout = send_timeout
        self._waiting: Optional[defer.Deferred] = None

    def wait(self, lost: bool, blocked: bool) -> defer.Deferred:
        """Fires True once the output queued now is sent (at once if none is: not ``blocked``), False if the
        connection is lost."""
        if lost:
            return defer.succeed(False)
        if not blocked:
            return defer.succeed(True)
        self._deadline.arm(self._send_timeout, ABORT)
        self._waiting = defer.Deferred()
        return self._waiting

    def fire(self, sent: bool) -> None:
        """The queued output was sent (``sent``), or the connection was lost: the waiting handler goes on."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            if sent:
                self._deadline.disarm()
            waiting.callback(sent)
