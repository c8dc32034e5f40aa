"""Connections queued for a dead worker, handed by the master to the serving ones.

When a worker dies, the master steers new connections away from its slot
(``api.steering``), but those the kernel had already queued on the slot's
socket would wait there for the successor to start and warm (seconds). So
the master accepts them itself and sends each, as a file descriptor
(``SCM_RIGHTS``), over a socket pair it holds with each worker (the
worker's ``HANDOFF_FD``) to the serving workers in turn; a worker adopts
what it receives as one of its own connections.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Sequence

from twisted.logger import Logger

HANDOFF_FD = 5
# Descriptors a worker takes per message read; the master sends one per message.
_MAX_FDS = 16
# A connection lost on its way (its client sees a reset): a warning.
_log = Logger()


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """The master's end and the worker's: messages keep their bounds, so each carries its descriptor."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    return ours, theirs


def hand_over_queued(listener: socket.socket, channels: Sequence[socket.socket]) -> int:
    """Accept every connection ``listener`` holds queued and send each to one of ``channels`` in turn.

    Returns how many were handed over; one a worker cannot take is closed (its client sees a reset).
    """
    handed = 0
    while True:
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return handed
        with connection:
            try:
                socket.send_fds(channels[handed % len(channels)], [b"c"], [connection.fileno()])
            except OSError as error:
                _log.warn("a queued connection could not be handed to a worker: {error}", error=error)
        handed += 1


class Receiver:
    """A worker's end of its channel: every descriptor that comes is adopted as a connection of ``factory``."""

    def __init__(self, fd: int, reactor: Any, factory: Any) -> None:
        self.channel = socket.socket(fileno=fd)
        self.channel.setblocking(False)
        self.reactor = reactor
        self.factory = factory
        reactor.addReader(self)

    def fileno(self) -> int:
        return self.channel.fileno()

    def logPrefix(self) -> str:
        return "handoff"

    def doRead(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.channel, 16, _MAX_FDS)
            except (BlockingIOError, InterruptedError):
                return
            for fd in fds:
                self._adopt(fd)
            if not message and not fds:  # the master is gone
                self.stop()
                return

    def _adopt(self, fd: int) -> None:
        try:
            with socket.socket(fileno=os.dup(fd)) as probe:
                family = probe.family
            self.reactor.adoptStreamConnection(fd, family, self.factory)
        except OSError as error:
            _log.warn("a handed-over connection could not be adopted: {error}", error=error)
        finally:
            os.close(fd)  # adoptStreamConnection took its own copy

    def connectionLost(self, reason: Any) -> None:
        self.channel.close()

    def stop(self) -> None:
        self.reactor.removeReader(self)
        self.channel.close()
