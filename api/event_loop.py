"""The workers' reactor: Twisted's epoll reactor, dispatching events directly.

For every ready socket, Twisted's ``EPollReactor.doPoll`` goes through
``log.callWithLogger``: it asks the transport for its log prefix, builds a
context dictionary and pushes it, only so that legacy ``log.msg`` calls made
while handling the event are tagged with it. Jetway's log lines do not carry
that tag, and on PyPy the wrapper was a visible share of a document read's
worker CPU under vmprof (docs/history/performance.md, "The changes, in the
order done"). ``doPoll`` here is Twisted's without the wrapper; an
error that escapes a transport's own handling is still logged.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Set

from twisted.internet import epollreactor
from twisted.internet.main import installReactor
from twisted.logger import Logger

from cache import twisted_internals

_log = Logger()


class DirectEPollReactor(epollreactor.EPollReactor):
    """``EPollReactor`` whose event dispatch skips the per-event log context.

    Descriptors named by ``read_first`` (the hot cache's invalidation
    connections, ``cache.hot.tracking``) are handled before the others of the
    same poll, so that a request that came in the same poll as an
    invalidation is answered after the invalidation is applied.

    What is registered with ``after_each_poll`` runs once every poll's
    events are handled: the access log writes a poll's lines there, at the
    cost of a call, where a ``callLater(0)`` per poll made and scheduled a
    timer. What is registered with ``before_each_wait`` runs before each
    wait for events, once the pass's events and due timers are handled: the
    Redis links send the pass's commands there (``cache.redis.resp``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._first: Set[int] = set()
        self._after_poll: List[Callable[[], None]] = []
        self._before_wait: List[Callable[[], None]] = []

    def after_each_poll(self, call: Callable[[], None]) -> None:
        """Call ``call()`` after the events of every poll are handled (an error in it is logged)."""
        self._after_poll.append(call)

    def no_longer_after_each_poll(self, call: Callable[[], None]) -> None:
        """Stop calling what ``after_each_poll`` was given (a warm-up's log, ``api.warm_up``)."""
        if call in self._after_poll:
            self._after_poll.remove(call)

    def polled(self) -> None:
        """What runs as a poll's events are done (``after_each_poll``)."""
        _call_each(self._after_poll, "after a poll")

    def read_first(self, fd: int, first: bool = True) -> None:
        """Handle ``fd``'s events before the others of a poll (or no longer)."""
        if first:
            self._first.add(fd)
        else:
            self._first.discard(fd)

    def before_each_wait(self, call: Callable[[], None]) -> None:
        """Call ``call()`` before every wait for events (an error in it is logged)."""
        self._before_wait.append(call)

    def doPoll(self, timeout: Optional[float]) -> None:
        if self._before_wait:
            _call_each(self._before_wait, "before a poll")
        try:
            events = twisted_internals.poll(self, timeout)
        except InterruptedError:
            return
        if self._first:
            first = self._first
            events = [event for event in events if event[0] in first] + [e for e in events if e[0] not in first]
        watched = twisted_internals.selectables(self)
        for fd, event in events:
            selectable = watched.get(fd)
            if selectable is None:
                continue  # closed by an earlier event of this same poll
            try:
                twisted_internals.handle_event(self, selectable, fd, event)
            except Exception:
                _log.failure("while handling an event of {selectable!r}", selectable=selectable)
        if self._after_poll:
            self.polled()

    doIteration = doPoll  # the base class binds its own doPoll under this name


def _call_each(calls: List[Callable[[], None]], when: str) -> None:
    """Each of ``calls``; one that raises is logged and the others still run."""
    for call in calls:
        try:
            call()
        except Exception:
            _log.failure(when + ", in {call!r}", call=call)


def install() -> Any:
    """Install ``DirectEPollReactor`` as the global reactor and return it.

    Call before anything imports ``twisted.internet.reactor``.
    """
    reactor = DirectEPollReactor()
    installReactor(reactor)
    return reactor
