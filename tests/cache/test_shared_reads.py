"""api.shared_reads: reads through one buffer hand each connection's protocol its own bytes, whole and in order."""

from __future__ import annotations

import contextlib
import functools
import socket
from typing import Iterator, List, Tuple

import pytest
from twisted.internet import main, reactor, tcp
from twisted.internet.protocol import Protocol

from api.shared_reads import READ_SIZE, read_into_shared_buffer


class Recording(Protocol):
    def __init__(self) -> None:
        self.received: List[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self.received.append(data)


@pytest.fixture
def connections() -> Iterator[List[Tuple[socket.socket, tcp.Connection, Recording]]]:
    """Two socket pairs, each with a Twisted connection on one end: (peer, connection, protocol)."""
    made = []
    for _ in range(2):
        peer, ours = socket.socketpair()
        ours.setblocking(False)
        protocol = Recording()
        connection = tcp.Connection(ours, protocol, reactor)
        connection.doRead = functools.partial(read_into_shared_buffer, connection)  # as EagerServer's
        made.append((peer, connection, protocol))
    yield made
    for peer, connection, _ in made:
        peer.close()
        connection.socket.close()


def test_each_read_hands_over_a_copy_that_later_reads_leave_alone(connections):
    (peer_a, conn_a, proto_a), (peer_b, conn_b, proto_b) = connections
    peer_a.sendall(b"GET /a HTTP/1.1\r\n\r\n")
    peer_b.sendall(b"x" * 1000)
    conn_a.doRead()
    conn_b.doRead()
    assert proto_a.received == [b"GET /a HTTP/1.1\r\n\r\n"]
    assert proto_b.received == [b"x" * 1000]


def test_more_than_one_read_holds_arrives_whole_in_order(connections):
    peer, connection, protocol = connections[0]
    message = bytes(range(256)) * (3 * READ_SIZE // 256 + 7)
    peer.setblocking(False)
    sent = 0
    while b"".join(protocol.received) != message:
        if sent < len(message):
            with contextlib.suppress(BlockingIOError):  # the kernel's buffer is full until we read
                sent += peer.send(message[sent:])
        connection.doRead()
    assert max(len(piece) for piece in protocol.received) <= READ_SIZE
    assert len(protocol.received) >= 4


def test_nothing_to_read_is_no_event_and_a_closed_peer_is_the_end(connections):
    peer, connection, protocol = connections[0]
    assert connection.doRead() is None
    peer.close()
    assert connection.doRead() is main.CONNECTION_DONE
    assert protocol.received == []
