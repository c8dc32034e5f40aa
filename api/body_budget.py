"""A worker's budget for request bodies held in memory.

Each connection receiving a body reserves what the body may grow to (its
``Content-Length``, or for a chunked body the chunk sizes announced so
far) and gives it back when its request is finished or the connection is
lost. A body that does not fit is refused at once with 503 and
``Retry-After`` rather than made to wait: a waiting client cannot tell a
busy server from a dead one, and the bodies that hold the budget may be an
attacker's, trickling until their body timeout (docs/operations.md,
"Hostile clients").
"""

from __future__ import annotations


class BodyBudget:
    """Bytes reserved by unfinished request bodies, against a fixed limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0

    def reserve(self, size: int) -> bool:
        """Take ``size`` bytes if they fit; False (and nothing taken) if not."""
        if self.reserved + size > self.limit:
            return False
        self.reserved += size
        return True

    def release(self, size: int) -> None:
        self.reserved -= size
