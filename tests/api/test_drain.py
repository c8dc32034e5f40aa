"""A drain's rules (``api.drain``), on a driven clock: which connection it closes when, and when it stops."""

from __future__ import annotations

import socket
from typing import Iterator, List, Optional, Set

import pytest
from twisted.internet import task

from api.drain import IDLE_CLOSE, LINGER, TICK, Drain, unread_bytes

GRACE = 10.0


class Reactor(task.Clock):
    stopped = False

    def stop(self) -> None:
        self.stopped = True


class Transport:
    def __init__(self, app: App, connection: Connection, handle: Optional[socket.socket]) -> None:
        self.app, self.connection, self.handle = app, connection, handle

    def getHandle(self) -> socket.socket:
        if self.handle is None:
            raise AttributeError("no socket")
        return self.handle

    def abortConnection(self) -> None:
        self.connection.aborted = True
        self.app.connections.discard(self.connection)


class Connection:
    def __init__(self, app: App, idle_since: float, asked: bool, handle: Optional[socket.socket] = None) -> None:
        self.transport = Transport(app, self, handle)
        self.idle_since = idle_since
        self.asked = asked
        self.closing = self.lingering = self.aborted = self.answering = False
        app.connections.add(self)

    def busy(self) -> bool:
        return self.answering

    def close(self) -> None:
        self.lingering = True


class App:
    def __init__(self) -> None:
        self.connections: Set[Connection] = set()
        self.accepting = True

    def stop_accepting(self) -> None:
        self.accepting = False


class Port:
    listening = True

    def doRead(self) -> None:
        pass

    def stopListening(self) -> None:
        self.listening = False


@pytest.fixture
def reactor() -> Reactor:
    return Reactor()


@pytest.fixture
def app() -> App:
    return App()


def drained(reactor: Reactor, app: App) -> Drain:
    drain = Drain(app, Port(), reactor, GRACE)
    drain.start()
    return drain


def advance(reactor: Reactor, seconds: float) -> None:
    for _ in range(round(seconds / TICK)):
        reactor.advance(TICK)


@pytest.fixture
def pair() -> Iterator[List[socket.socket]]:
    ours, theirs = socket.socketpair()
    yield [ours, theirs]
    ours.close()
    theirs.close()


def test_every_connection_answers_with_close_from_the_start(reactor, app):
    connection = Connection(app, 0.0, asked=True)
    drained(reactor, app)
    assert connection.closing and not connection.lingering and not app.accepting


def test_an_answered_idle_connection_is_closed_once_idle_past_idle_close(reactor, app):
    connection = Connection(app, 0.0, asked=True)
    drained(reactor, app)
    advance(reactor, IDLE_CLOSE - 2 * TICK)
    assert not connection.lingering
    advance(reactor, 3 * TICK)
    assert connection.lingering and not connection.aborted


def test_a_connection_that_asked_nothing_is_kept_until_the_end_of_the_grace_less_a_linger(reactor, app):
    """Its client connected to ask: the request is on its way, however long it takes."""
    connection = Connection(app, 0.0, asked=False)
    drained(reactor, app)
    advance(reactor, GRACE - LINGER - 2 * TICK)
    assert not connection.lingering
    advance(reactor, 3 * TICK)
    assert connection.lingering


def test_a_connection_with_a_request_unread_in_the_kernel_is_not_closed(reactor, app, pair):
    ours, theirs = pair
    connection = Connection(app, 0.0, asked=True, handle=ours)
    theirs.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert unread_bytes(connection.transport) > 0
    drained(reactor, app)
    advance(reactor, IDLE_CLOSE + 1.0)
    assert not connection.lingering  # read on the reactor's next pass, then answered with Connection: close
    ours.recv(4096)
    advance(reactor, 2 * TICK)
    assert connection.lingering


def test_a_busy_connection_is_left_to_its_answer(reactor, app):
    connection = Connection(app, 0.0, asked=True)
    connection.answering = True
    drained(reactor, app)
    advance(reactor, IDLE_CLOSE + 1.0)
    assert not connection.lingering and not connection.aborted


def test_a_lingering_connection_is_aborted_a_linger_after_and_then_the_reactor_stops(reactor, app):
    connection = Connection(app, 0.0, asked=True)
    drained(reactor, app)
    advance(reactor, IDLE_CLOSE + TICK)
    assert connection.lingering and not reactor.stopped
    advance(reactor, LINGER + 2 * TICK)
    assert connection.aborted and reactor.stopped


def test_at_the_end_of_the_grace_everything_left_is_aborted(reactor, app):
    busy = Connection(app, 0.0, asked=True)
    busy.answering = True
    unasked = Connection(app, 0.0, asked=False)
    drained(reactor, app)
    advance(reactor, GRACE + TICK)
    assert busy.aborted and unasked.aborted and reactor.stopped


def test_with_no_connection_the_drain_stops_the_reactor_at_its_first_tick(reactor, app):
    drained(reactor, app)
    advance(reactor, TICK)
    assert reactor.stopped
