"""Ids unique across a worker's life, cheap enough for every request: a random prefix, then a count.

The count is written in decimal, sixteen digits from 10**15: decimal digits
are hex digits, so an id has the form of hex digits (request ids, W3C trace
ids), and at a fixed width no two counts make one id. On PyPy a format spec
(``f"{n:016x}"``) or an f-string cost several times as much, on nearly every
request (docs/history/performance.md, "Strings on PyPy").
"""

from __future__ import annotations

import itertools
import os


class CountedIds:
    """``prefix`` (``prefix_bytes`` random bytes in hex) and, at each ``count``, sixteen more digits."""

    def __init__(self, prefix_bytes: int = 8) -> None:
        self.prefix = os.urandom(prefix_bytes).hex()
        self._count = itertools.count(10**15)

    def count(self) -> str:
        """The next count alone: sixteen digits."""
        return str(next(self._count))

    def new(self) -> str:
        """The prefix and the next count."""
        return self.prefix + str(next(self._count))
