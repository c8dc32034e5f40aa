"""Server-made identifiers: document ids (ULIDs, sortable by creation time) and ETags."""

from __future__ import annotations

import base64
import itertools
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
        return encode_ulid((now_ms << 80) | self._last_random)


def encode_ulid(value: int) -> str:
    """A 128-bit value as a ULID's 26 Crockford base-32 characters."""
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


class EtagFactory:
    """Strong ETags, a new one for every write: a random part drawn once, then a counter.

    Random, not a hash of the body: the ETag must change on every write, even
    one that writes identical bytes. The random part (96 bits) tells
    processes apart, the counter this process's writes. Drawing 12 random
    bytes per write instead (``os.urandom``, a system call) was a visible
    share of a small PUT under vmprof (docs/history/performance.md, "The
    changes, in the order done").
    """

    def __init__(self) -> None:
        self._random = base64.urlsafe_b64encode(os.urandom(12))
        self._writes = itertools.count()

    def new(self) -> bytes:
        return b'"%s%x"' % (self._random, next(self._writes))
