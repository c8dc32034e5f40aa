"""``api.event_loop``: the workers' reactor dispatches epoll events, and is the one installed."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
from twisted.internet import abstract, main
from twisted.logger import globalLogPublisher
from twisted.python import log

from api.event_loop import DirectEPollReactor


class SocketReader(abstract.FileDescriptor):
    """A readable socket that records what arrives, or fails as told."""

    def __init__(self, sock: socket.socket, reactor: DirectEPollReactor, fail: bool = False) -> None:
        super().__init__(reactor)
        self.sock = sock
        self.fail = fail
        self.received = b""

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> Any:
        data = self.sock.recv(100)
        if not data:
            return main.CONNECTION_DONE  # the reactor then calls connectionLost
        self.received += data
        if self.order is not None:
            self.order.append(self)
        return None

    order = None  # a list to append this reader to when it reads

    def connectionLost(self, reason: Any) -> None:
        if self.fail:
            raise RuntimeError("a broken connectionLost")
        super().connectionLost(reason)


@pytest.fixture
def reactor() -> Iterator[DirectEPollReactor]:
    reactor = DirectEPollReactor()
    try:
        yield reactor
    finally:
        reactor._poller.close()  # drops every registration with it


@pytest.fixture
def fed(reactor: DirectEPollReactor) -> Iterator[Tuple[SocketReader, socket.socket]]:
    """A reader registered with the reactor, and the socket that feeds it; both closed after."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        reader = SocketReader(ours, reactor)
        reactor.addReader(reader)
        yield reader, theirs


@pytest.fixture
def logged() -> Iterator[List[Dict[str, Any]]]:
    events: List[Dict[str, Any]] = []
    globalLogPublisher.addObserver(events.append)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(events.append)


def raising(message: str) -> Callable[[], None]:
    """A call for the reactor's hooks that raises ``message``."""

    def broken() -> None:
        raise RuntimeError(message)

    return broken


def failure_logged(logged: List[Dict[str, Any]], message: str) -> bool:
    """Whether a failure carrying ``message`` was logged."""
    return any(message in str(event["log_failure"].value) for event in logged if "log_failure" in event)


def test_a_readable_socket_is_read_without_a_log_context_per_event(reactor, fed, monkeypatch):
    reader, theirs = fed
    wrapped: List[Any] = []
    monkeypatch.setattr(log, "callWithLogger", lambda *args, **kwargs: wrapped.append(args))
    theirs.sendall(b"ping")
    reactor.doIteration(1.0)
    assert reader.received == b"ping"
    assert wrapped == [], "the event went through Twisted's per-event log context"


def test_an_error_that_escapes_a_transport_is_logged_and_the_loop_goes_on(reactor, logged):
    broken_ours, broken_theirs = socket.socketpair()
    ours, theirs = socket.socketpair()
    with broken_ours, ours, theirs:
        broken = SocketReader(broken_ours, reactor, fail=True)
        healthy = SocketReader(ours, reactor)
        reactor.addReader(broken)
        reactor.addReader(healthy)
        broken_theirs.close()  # hang-up: the reactor calls connectionLost, which raises
        theirs.sendall(b"still served")
        reactor.doIteration(1.0)
        assert healthy.received == b"still served"
    assert failure_logged(logged, "a broken connectionLost"), logged


def test_descriptors_named_read_first_are_read_before_the_others_of_a_poll(reactor):
    pairs = [socket.socketpair() for _ in range(6)]
    try:
        order: List[SocketReader] = []
        readers = [SocketReader(ours, reactor) for ours, _ in pairs]
        for reader in readers:
            reader.order = order
            reactor.addReader(reader)
        first = readers[-1]  # ready last, registered last: read first all the same
        reactor.read_first(first.fileno())
        for _, theirs in pairs:
            theirs.sendall(b"x")
        reactor.doIteration(1.0)
        assert len(order) == 6 and order[0] is first
        reactor.read_first(first.fileno(), False)
        for _, theirs in pairs:
            theirs.sendall(b"y")
        reactor.doIteration(1.0)
        assert order[6:][-1] is first  # in the poll's own order again
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


def test_python_m_api_runs_on_this_reactor_even_though_txredisapi_imports_one():
    # A fresh interpreter, as ``python -m api`` starts: install, then import
    # the worker (and with it txredisapi).
    script = (
        "from api import event_loop\n"
        "installed = event_loop.install()\n"
        "import api.worker, txredisapi\n"
        "from twisted.internet import reactor\n"
        "print(type(reactor).__name__, reactor is installed, txredisapi.reactor is installed)\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.split() == ["DirectEPollReactor", "True", "True"]


def test_what_runs_after_each_poll_runs_once_its_events_are_handled(reactor, fed, logged):
    reader, theirs = fed
    seen: List[bytes] = []
    reactor.after_each_poll(raising("a broken after-poll call"))
    reactor.after_each_poll(lambda: seen.append(reader.received))
    theirs.sendall(b"ping")
    reactor.doIteration(1.0)
    assert seen == [b"ping"]  # after the event, and despite the call before it failing
    reactor.doIteration(0)  # a poll with no event runs it too
    assert seen == [b"ping", b"ping"]
    assert failure_logged(logged, "a broken after-poll call"), logged


def test_what_runs_before_each_wait_runs_before_the_poll_sees_its_events(reactor, fed, logged):
    """A call made before the wait can produce what that same poll reads (the Redis links' writes)."""
    reader, theirs = fed
    sent: List[int] = []
    reactor.before_each_wait(raising("a broken before-wait call"))
    reactor.before_each_wait(lambda: sent.append(theirs.send(b"sent before the wait")))
    reactor.doIteration(1.0)
    assert reader.received == b"sent before the wait"  # read in that poll, despite the call before failing
    reactor.doIteration(0)
    assert len(sent) == 2  # every wait, with or without events
    assert failure_logged(logged, "a broken before-wait call"), logged
