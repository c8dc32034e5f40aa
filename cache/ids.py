"""Server-made document ids: ULIDs, sortable by creation time."""

from __future__ import annotations

import os
import time
from typing import Callable

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


class UlidFactory:
    """Makes ULIDs that sort in creation order, also within one millisecond.

    Within the same millisecond the random part is incremented instead of
    drawn again, so ids made by one process never sort out of order.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._last_ms = -1
        self._last_random = 0

    def new(self) -> str:
        now_ms = int(self._clock() * 1000)
        if now_ms <= self._last_ms:
            now_ms = self._last_ms
            self._last_random = (self._last_random + 1) & ((1 << 80) - 1)
        else:
            self._last_ms = now_ms
            self._last_random = int.from_bytes(os.urandom(10), "big")
        return _encode((now_ms << 80) | self._last_random)


def _encode(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))
