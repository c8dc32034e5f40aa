"""Handing a dead worker's queued connections to a serving one (``api.handoff``), over real sockets."""

from __future__ import annotations

import socket
from typing import Any, List, Tuple

from api.handoff import Receiver, channel_pair, hand_over_queued


class Reactor:
    """Records what a worker's reactor is asked to read and to adopt."""

    def __init__(self) -> None:
        self.readers: List[Any] = []
        self.adopted: List[Tuple[int, int]] = []  # (the client's port, the family)

    def addReader(self, reader: Any) -> None:
        self.readers.append(reader)

    def removeReader(self, reader: Any) -> None:
        self.readers.remove(reader)

    def adoptStreamConnection(self, fd: int, family: int, factory: Any) -> None:
        with socket.socket(fileno=fd) as adopted:
            self.adopted.append((adopted.getpeername()[1], family))
            adopted.detach()  # the caller closes fd


def test_every_queued_connection_reaches_a_worker_which_adopts_it():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    ours, theirs = channel_pair()
    reactor = Reactor()
    receiver = Receiver(theirs.detach(), reactor, factory=None)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(5)]
    try:
        assert hand_over_queued(listener, [ours]) == 5
        assert hand_over_queued(listener, [ours]) == 0  # the queue is empty now
        receiver.doRead()
        assert sorted(reactor.adopted) == sorted((client.getsockname()[1], socket.AF_INET) for client in clients)
        ours.close()  # the master is gone: the worker stops reading its end
        receiver.doRead()
        assert reactor.readers == []
    finally:
        for client in clients:
            client.close()
        listener.close()


def test_the_connections_alternate_between_serving_workers():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    pairs = [channel_pair(), channel_pair()]
    clients = [socket.create_connection(listener.getsockname()) for _ in range(4)]
    try:
        assert hand_over_queued(listener, [ours for ours, _ in pairs]) == 4
        for _, theirs in pairs:
            received = 0
            theirs.setblocking(False)
            while True:
                try:
                    _, fds, _, _ = socket.recv_fds(theirs, 16, 4)
                except BlockingIOError:
                    break
                received += len(fds)
                for fd in fds:
                    socket.socket(fileno=fd).close()
            assert received == 2
    finally:
        for client in clients:
            client.close()
        listener.close()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
