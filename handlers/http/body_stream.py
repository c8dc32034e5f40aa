"""A request body handed to its handler as it arrives, with back-pressure (the NDJSON import's).

The connection (``api.connection``) feeds what it reads; the handler
``read``s it. The stream holds at most about ``limit`` bytes: past that it
tells its feeder there is no room (the connection stops reading the socket)
and calls ``on_room`` once the handler has taken what it held (the
connection reads on). So the input a streamed request holds in the worker
is bounded whatever the body's size.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from twisted.internet import defer


class BodyLost(Exception):
    """The connection went away (or its request was answered) before the body ended."""


class BodyStream:
    """One request's body, in the pieces it arrived in, until ``finish`` or ``fail``."""

    def __init__(self, limit: int, on_room: Callable[[], None] = lambda: None) -> None:
        self.limit = limit
        self.on_room = on_room
        self.held = 0
        self.complete = False
        self.error: Optional[Exception] = None
        self._parts: List[bytes] = []
        self._waiting: Optional[defer.Deferred] = None
        self._until: Optional[bytes] = None  # the waiting read wants a piece holding this, or a full stream

    @classmethod
    def of(cls, body: bytes) -> BodyStream:
        """A stream of a body already read whole."""
        stream = cls(len(body))
        if body:
            stream.feed(body)
        stream.finish()
        return stream

    @property
    def ended(self) -> bool:
        return self.complete or self.error is not None

    def has_room(self) -> bool:
        return self.held < self.limit

    # The feeder's side.

    def feed(self, data: bytes) -> bool:
        """Hold ``data`` for the handler; False when the stream is full (stop reading until ``on_room``)."""
        if self.ended:
            return False
        self._parts.append(data)
        self.held += len(data)
        if self._until is None or self._until in data or not self.has_room():
            self._wake()
        return self.has_room()

    def finish(self) -> None:
        if not self.ended:
            self.complete = True
            self._wake()

    def fail(self, error: Exception) -> None:
        """The body will not end: the handler's next read (once what is held is taken) raises ``error``."""
        if not self.ended:
            self.error = error
            self._wake()

    # The handler's side.

    def read(self, until: Optional[bytes] = None) -> defer.Deferred:
        """What arrived since the last read (all of it), ``b""`` at the end; fails with the stream's error.

        With ``until`` (a line reader's ``b"\\n"``), a read that must wait is
        woken only by a piece holding ``until``, a full stream or the end: a
        long line arriving in small pieces wakes its reader once per
        ``limit`` bytes, not once per piece.
        """
        if self._waiting is not None:
            raise RuntimeError("one read at a time")
        if self._parts or self.ended:
            return defer.succeed(self._take()) if self._parts or self.error is None else defer.fail(self.error)
        self._until = until
        self._waiting = defer.Deferred()
        return self._waiting

    def _take(self) -> bytes:
        data = b"".join(self._parts)
        full = not self.has_room()
        self._parts, self.held = [], 0
        if full and not self.ended:
            self.on_room()
        return data

    def _wake(self) -> None:
        waiting, self._waiting, self._until = self._waiting, None, None
        if waiting is None:
            return
        if self._parts or self.error is None:
            waiting.callback(self._take())
        else:
            waiting.errback(self.error)
