"""Client connections that send a response at once when nothing waits before it.

Twisted's transports never send in ``write``: they queue the bytes, ask
epoll to report the socket writable (one ``epoll_ctl``), send on the next
pass of the loop, and then withdraw the interest (a second ``epoll_ctl``).
A response here is one ``write`` into a socket whose kernel buffer is
empty, so those two system calls and the extra pass buy nothing. These
transports try ``send`` first and queue only what the kernel did not take,
so ordering, back-pressure and error handling stay Twisted's.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import tcp

from api.shared_reads import read_into_shared_buffer
from cache.twisted_internals import adopted_port, send_at_once


class EagerServer(tcp.Server):
    """A TCP server connection whose ``write`` sends straight away when its queue is empty.

    It reads into the process's shared buffer too (``api.shared_reads``).
    """

    doRead = read_into_shared_buffer

    def write(self, data: bytes) -> None:
        if data:
            data = send_at_once(self, data)
        if data:
            super().write(data)


class EagerPort(tcp.Port):
    """A listening port whose accepted connections are ``EagerServer``s."""

    transport = EagerServer


def adopt_listening_socket(reactor: Any, fd: int, family: socket.AddressFamily, factory: Any) -> Any:
    """``reactor.adoptStreamPort`` for a TCP socket, with eager-sending connections."""
    if family not in (socket.AF_INET, socket.AF_INET6):
        return reactor.adoptStreamPort(fd, family, factory)
    # What adoptStreamPort does for TCP; it takes no transport class, so
    # the port class that names one is built the same way here.
    port = adopted_port(EagerPort, reactor, fd, family, factory)
    port.startListening()
    return port
