"""``api.eager_send`` on real loopback sockets: sent at once, or queued in order."""

from __future__ import annotations

import contextlib
import socket
from typing import Iterator, Tuple

import pytest
from twisted.internet import protocol
from twisted.internet.epollreactor import EPollReactor

from api.eager_send import EagerServer


@pytest.fixture
def pair() -> Iterator[Tuple[EagerServer, socket.socket, EPollReactor]]:
    """A server transport (small send buffer) and the client socket (small receive buffer) it talks to."""
    reactor = EPollReactor()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
        client.connect(listener.getsockname())
        accepted, address = listener.accept()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    accepted.setblocking(False)
    transport = EagerServer(accepted, protocol.Protocol(), address, None, 1, reactor)  # type: ignore[arg-type]
    transport.startReading()
    try:
        yield transport, client, reactor
    finally:
        transport.stopReading()
        transport.stopWriting()
        accepted.close()
        client.close()
        reactor._poller.close()


def test_a_write_into_an_empty_queue_is_sent_without_asking_epoll(pair):
    transport, client, reactor = pair
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport not in reactor.getWriters()
    client.settimeout(2)
    assert client.recv(100) == b"HTTP/1.1 200 OK\r\n\r\n"


def test_what_the_kernel_does_not_take_is_queued_and_later_writes_wait_behind_it(pair):
    transport, client, reactor = pair
    big = bytes(range(256)) * 4096  # 1 MiB, far above both buffers
    transport.write(big)
    assert transport in reactor.getWriters(), "the rest of the big write should wait for epoll"
    transport.write(b"TAIL")  # must not jump the queue
    received = bytearray()
    client.setblocking(False)
    for _ in range(100_000):
        if len(received) == len(big) + 4:
            break
        transport.doWrite()
        with contextlib.suppress(BlockingIOError):  # nothing arrived yet
            received += client.recv(65536)
    assert bytes(received) == big + b"TAIL"
    assert transport not in reactor.getWriters()
