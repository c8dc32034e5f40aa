"""Steering a slot group's new connections (``api.steering``) to the sockets of serving slots only."""

from __future__ import annotations

import socket
from typing import Iterator, List

import pytest

from api.sockets import bind_listeners
from api.steering import steer

CONNECTIONS = 30


@pytest.fixture
def listeners() -> Iterator[List[socket.socket]]:
    group = bind_listeners("127.0.0.1", 0, 3)
    yield group
    for listener in group:
        listener.close()


def queued(listeners: List[socket.socket]) -> List[int]:
    """Open CONNECTIONS connections; how many each listener's queue got."""
    port = listeners[0].getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS)]
    counts = []
    for listener in listeners:
        count = 0
        while True:
            try:
                accepted, _ = listener.accept()
            except BlockingIOError:
                break
            accepted.close()
            count += 1
        counts.append(count)
    for client in clients:
        client.close()
    return counts


def test_new_connections_go_to_the_serving_slots_only(listeners):
    steer(listeners[0], 3, [1])
    assert queued(listeners) == [0, CONNECTIONS, 0]
    steer(listeners[2], 3, [0, 2])  # any socket of the group steers it
    counts = queued(listeners)
    assert counts[1] == 0 and sum(counts) == CONNECTIONS


def test_with_every_slot_serving_the_kernel_spreads_them_again(listeners):
    steer(listeners[0], 3, [1])
    steer(listeners[0], 3, [0, 1, 2])
    steer(listeners[0], 3, [0, 1, 2])  # nothing attached: no error
    counts = queued(listeners)
    assert sum(counts) == CONNECTIONS and counts.count(0) < 2, counts
