"""A client connection's one deadline: when it times out, and what it does then (``api.connection``).

A connection has one deadline at a time, the one for what it waits for:
its request's head, its body, the next request (the idle keep-alive) or
the client taking its output (the send timeout); each is armed in place of
the last, and the application's sweep checks every connection's each
quarter second (``api.application``). The send timeout counts from the
client's last progress, as nginx's ``send_timeout`` does: a client that
reads, however slowly, is not aborted.
"""

from __future__ import annotations

import fcntl
import struct
import termios
from typing import Any, Optional

from cache.twisted_internals import unsent_bytes

# What a deadline does besides answering a status: close an idle
# connection quietly, or abort one whose queued output is not being read.
CLOSE: Optional[int] = None
ABORT = -1


def unsent(transport: Any) -> int:
    """Bytes of output the client has not taken: queued by the transport, and in the kernel.

    The kernel's part matters: its send buffer grows to megabytes, and
    a socket is reported writable only once much of it is free, so the
    transport's queue can stand still for seconds while a slow client
    reads steadily.
    """
    queued = unsent_bytes(transport)
    try:
        in_kernel = struct.unpack("i", fcntl.ioctl(transport.socket.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, AttributeError):
        in_kernel = 0  # closed meanwhile, or not a socket
    return queued + in_kernel


class Deadline:
    """When a connection times out (``at``; None: not armed), and its ``action``: a status, ``CLOSE`` or ``ABORT``.

    ``clock`` is the connection's reactor, ``transport`` its transport (whose
    output an ``ABORT`` watches).
    """

    def __init__(self, clock: Any, transport: Any) -> None:
        self.at: Optional[float] = None
        self.action: Optional[int] = None
        self._clock = clock
        self._transport = transport
        self._unsent_seen = 0
        self._send_timeout = 0.0

    def arm(self, seconds: float, action: Optional[int]) -> None:
        self.at = self._clock.seconds() + seconds
        self.action = action
        if action == ABORT:
            self._send_timeout = seconds
            self._unsent_seen = unsent(self._transport)

    def disarm(self) -> None:
        self.at = None

    def passed(self, now: float) -> bool:
        """Whether the deadline has passed by ``now`` (then it is disarmed).

        An ``ABORT`` whose client took some of its output since it was
        armed is armed again, for as long.
        """
        if self.at is None:
            return False
        if self.action == ABORT and unsent(self._transport) < self._unsent_seen:
            self.arm(self._send_timeout, ABORT)
            return False
        if now >= self.at:
            self.at = None
            return True
        return False
