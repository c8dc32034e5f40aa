"""Client connections that send a response at once when nothing waits before it.

Twisted's transports never send in ``write``: they queue the bytes, ask
epoll to report the socket writable (one ``epoll_ctl``), send on the next
pass of the loop, and then withdraw the interest (a second ``epoll_ctl``).
A response here is one ``write`` into a socket whose kernel buffer is
empty, so those two system calls and the extra pass buy nothing. These
transports try ``send`` first and queue only what the kernel did not take,
so ordering, back-pressure and error handling stay Twisted's.

``writeSequence`` does the same for a head and a large body sent side by
side with one ``sendmsg``, so the body is not copied onto its head first
(``handlers.base.BaseHandler.flush``).
"""

from __future__ import annotations

import socket
from typing import Any, List, Sequence

from twisted.internet import tcp

from cache.shared_reads import read_into_shared_buffer


class EagerServer(tcp.Server):
    """A TCP server connection whose ``write`` sends straight away when its queue is empty.

    It reads into the process's shared buffer too (``cache.shared_reads``).
    """

    doRead = read_into_shared_buffer

    def write(self, data: bytes) -> None:
        if data and self._can_send_now():
            try:
                sent = self.socket.send(data)
            except OSError:
                # Would block, or the peer is gone: the queued path below
                # sends later or reports the loss as Twisted always does.
                sent = 0
            data = data[sent:]
        if data:
            super().write(data)

    def writeSequence(self, parts: Sequence[bytes]) -> None:
        if self._can_send_now():
            try:
                sent = self.socket.sendmsg(parts)
            except OSError:
                sent = 0  # as in write: the queued path below takes over
            parts = unsent_parts(parts, sent)
        if parts:
            super().writeSequence(parts)

    def _can_send_now(self) -> bool:
        """Open for writing, in plain text, and nothing queued that must go first."""
        writable = self.connected and not self._writeDisconnected and not self.TLS
        return writable and not self._tempDataLen and self.offset == len(self.dataBuffer)


def unsent_parts(parts: Sequence[bytes], sent: int) -> List[bytes]:
    """What is left of ``parts`` once their first ``sent`` bytes are sent."""
    left = []
    for part in parts:
        if sent >= len(part):
            sent -= len(part)
            continue
        left.append(part[sent:] if sent else part)
        sent = 0
    return left


class EagerPort(tcp.Port):
    """A listening port whose accepted connections are ``EagerServer``s."""

    transport = EagerServer


def adopt_listening_socket(reactor: Any, fd: int, family: socket.AddressFamily, factory: Any) -> Any:
    """``reactor.adoptStreamPort`` for a TCP socket, with eager-sending connections."""
    if family not in (socket.AF_INET, socket.AF_INET6):
        return reactor.adoptStreamPort(fd, family, factory)
    # What adoptStreamPort does for TCP; it takes no transport class, so
    # the port class that names one is built the same way here.
    port = EagerPort._fromListeningDescriptor(reactor, fd, family, factory)
    port.startListening()
    return port
