"""A worker's budget for request bodies held in memory.

Each connection receiving a body reserves what the body may grow to (its
``Content-Length``, or for a chunked body the chunk sizes announced so
far: its ``Reservation``) and gives it back when its request is finished
or the connection is lost. A body that does not fit is refused at once
with 503 and ``Retry-After`` rather than made to wait: a waiting client
cannot tell a busy server from a dead one, and the bodies that hold the
budget may be an attacker's, trickling until their body timeout
(docs/operations.md, "Hostile clients").

Streamed bodies (an import's, which may rightly run for minutes) reserve
from a share of their own within the budget, ``STREAM_SHARE`` of it: any
number of slow imports leaves the rest to every other body.
"""

from __future__ import annotations

# The part of the budget streamed bodies may hold together.
STREAM_SHARE = 0.25


class BodyBudget:
    """Bytes reserved by unfinished request bodies, against a fixed limit; streamed ones against their share."""

    def __init__(self, limit: int, stream_limit: int = 0) -> None:
        self.limit = limit
        self.stream_limit = stream_limit or int(limit * STREAM_SHARE)
        self.reserved = 0
        self.streamed = 0

    def reserve(self, size: int, streamed: bool = False) -> bool:
        """Take ``size`` bytes if they fit; False (and nothing taken) if not."""
        if self.reserved + size > self.limit or (streamed and self.streamed + size > self.stream_limit):
            return False
        self.reserved += size
        if streamed:
            self.streamed += size
        return True

    def release(self, size: int, streamed: bool = False) -> None:
        self.reserved -= size
        if streamed:
            self.streamed -= size


class Reservation:
    """What one connection's request holds of a ``BodyBudget``: grown as its body is announced, given back after."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.size = 0
        self.streamed = False

    def grow(self, size: int, streamed: bool = False) -> bool:
        """Hold ``size`` bytes in all (a streamed body: of its share); False, and no more held, if they do not fit."""
        extra = size - self.size
        if extra <= 0:
            return True
        self.streamed = streamed
        if not self.budget.reserve(extra, streamed):
            return False
        self.size = size
        return True

    def release(self) -> None:
        if self.size:
            self.budget.release(self.size, self.streamed)
            self.size = 0
