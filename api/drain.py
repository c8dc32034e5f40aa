"""A worker's drain (SIGTERM/SIGINT, or the master replacing it): finish what may be in flight, then stop.

HTTP/1.1 has no way to tell a keep-alive client "send nothing more here":
a connection closed while its next request is on the way loses that
request (the client reads an empty answer: ``RemoteDisconnected``). So the
drain closes a connection only where no request can be on its way:

- Every connection's next answer carries ``Connection: close`` and the
  connection closes after it (``api.connection``): the client knows.
- A connection that has carried no request yet is not idle, its client is
  about to send one (a client connects to ask): it is kept until that
  request comes, and closed unasked only near the end of the grace.
- A keep-alive connection is closed once idle ``IDLE_CLOSE`` since its last
  answer, and never while a byte of a request waits for it, in its buffer
  or still in the kernel's (read by the reactor only after this tick: a
  worker busy for a while has both at once).
- Every close in a drain lingers (nginx's lingering close): the write side
  is shut once the answer is sent, and what the client still sends is read
  and dropped until it closes, or ``LINGER`` after, so that a reset never
  destroys an answer the client has not read yet.

Everything ends within the grace: whatever is still open then is aborted.
"""

from __future__ import annotations

import fcntl
import struct
import termios
from typing import Any, Callable, Dict, Optional

from twisted.internet import task

from api.signals import stop_reactor
from cache.twisted_internals import unsent_bytes

# A keep-alive connection idle this long during a drain is closed: longer
# than a loaded client takes to send its next request after an answer.
IDLE_CLOSE = 2.0
# How long a closed connection reads (and drops) after its last byte is
# sent: a round trip on a loaded machine, for the client to read the answer.
LINGER = 1.0
TICK = 0.1


class Drain:
    """Stop accepting, end the change-feed streams, let what may be in flight finish, then stop the reactor."""

    def __init__(
        self,
        app: Any,  # an api.application.JetwayApplication (not imported: it imports this module)
        port: Any,
        reactor: Any,
        grace: float,
        end_streams: Optional[Callable[[], None]] = None,
    ) -> None:
        self.app = app
        self.end_streams = end_streams
        self.port = port
        self.reactor = reactor
        self.grace = grace
        self.deadline: Optional[float] = None
        self.unasked_deadline = 0.0  # when a connection that never asked is closed all the same
        self.sent: Dict[Any, float] = {}  # a lingering connection: when its last byte was found sent

    def start(self) -> None:
        if self.deadline is not None:
            return
        now = self.reactor.seconds()
        self.deadline = now + self.grace
        self.unasked_deadline = now + max(self.grace - LINGER, 0.0)
        # Take what is already queued on our socket before letting go of it.
        self.port.doRead()
        self.app.stop_accepting()
        self.port.stopListening()
        for connection in list(self.app.connections):
            connection.closing = True  # before the first tick: an answer sent meanwhile says close
        if self.end_streams is not None:
            # A stream never finishes by itself: each gets a final event and
            # closes now, so its client reconnects to a worker that serves on.
            self.end_streams()
        self.ticking = task.LoopingCall(self._tick)
        self.ticking.clock = self.reactor
        self.ticking.start(TICK)

    def _tick(self) -> None:
        now = self.reactor.seconds()
        overdue = self.deadline is not None and now >= self.deadline
        for connection in list(self.app.connections):
            connection.closing = True
            if overdue or self._lingered(connection, now):
                connection.transport.abortConnection()
            elif not connection.lingering and self._may_close(connection, now):
                connection.close()
        if not self.app.connections or overdue:
            self.ticking.stop()
            stop_reactor(self.reactor)

    def _may_close(self, connection: Any, now: float) -> bool:
        """No request can be on its way on ``connection``: it is closed now."""
        if connection.busy() or unread_bytes(connection.transport):
            return False  # answered first, with Connection: close
        if not connection.asked:
            return now >= self.unasked_deadline
        return now - connection.idle_since >= IDLE_CLOSE

    def _lingered(self, connection: Any, now: float) -> bool:
        """Closed, its answer sent, and ``LINGER`` gone by since without the client closing its side."""
        if not connection.lingering or unsent_bytes(connection.transport):
            return False
        return now - self.sent.setdefault(connection, now) >= LINGER


def linger(transport: Any) -> None:
    """Shut ``transport``'s write side once its output is sent, and read on (the connection drops what comes)."""
    transport.loseWriteConnection()
    transport.resumeProducing()


def unread_bytes(transport: Any) -> int:
    """Bytes the kernel holds for ``transport``'s socket that no read took yet (0 if it cannot say)."""
    try:
        handle = transport.getHandle()
        raw = fcntl.ioctl(handle.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return int(struct.unpack("i", raw)[0])
