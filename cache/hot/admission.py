"""How often each document was read lately: what decides which misses may fill the hot cache.

TinyLFU's frequency sketch, in fixed memory whatever the number of keys:

- a doorkeeper, three bits per key in a bit array, remembers which keys were
  read since the last reset: a key's first read sets its bits and counts 1;
- a count-min sketch counts the reads after the first: three one-byte
  counters per key, its count the least of them (keys whose hashes collide
  can only make a count higher, never lower), at most ``MAX_COUNT``.

After every ``sample`` reads counted, the doorkeeper is cleared and every
counter halves, so counts tell how often a key was read lately.

``cache.hot.cache`` lets a miss fill only when its key was read at least
twice lately and, once the cache is full, more often than the entry the fill
would push out, by more than one read. A document read once costs what it costs without the cache;
and when more documents are read than the cache holds, an entry is not
swapped for another that is read no more often, which cost a fill, an
eviction and garbage for PyPy's old generation, and saved nothing.

Why a doorkeeper: a key read once is taken for one read twice when all its
positions are already taken by other keys. With K keys since the last reset
and three positions each among N, that is about (1 - e^(-3K/N))^3 of them:
at K = 600,000 (ten reads per entry the default cache holds of 200 B
documents), ~0.1% with the doorkeeper's 16 Mi bits (a little more with a
key's bits in one block, below; tests/cache/test_admission.py checks under 1% at
810,000), 56% with the 1 Mi counters alone (which let a read of 2,000,000
documents in turn, every read its document's first, fill the cache with
documents read once).
"""

from __future__ import annotations

from typing import Tuple

# The doorkeeper's bits: 16 Mi (2 MiB).
DOOR_BITS = 24
# The counters: 1 Mi bytes (1 MiB), for keys read more than once lately.
SKETCH_BITS = 20
# A count of the sketch never goes higher: enough to compare keys, and
# halving keeps recent reads ahead of old ones.
MAX_COUNT = 15
# Each counter's value once halved, for bytearray.translate (a C loop).
_HALVED = bytes(count >> 1 for count in range(256))
# A key's three bits, and its three counters, lie in one block of 64 bytes
# (a cache line): on a busy machine every other line is a trip to memory,
# and three lines a key made the cache's code a larger share of a served miss than one line does
# (``python -m loadtest.studies._request_path --serve 10 --serve-documents 200000``;
# docs/history/performance.md, "The miss path").
# From one 64-bit hash: the doorkeeper's block from its low bits (up to
# 15), the positions in a block from the next 27, the sketch's block from
# bit 42 on.
_BLOCK = 64
_SKETCH_BLOCK_SHIFT = 42


class FrequencySketch:
    """Recent reads per key, approximately, in ``2 ** (door_bits - 3) + 2 ** sketch_bits`` bytes."""

    def __init__(self, sample: int, door_bits: int = DOOR_BITS, sketch_bits: int = SKETCH_BITS) -> None:
        assert 9 <= door_bits <= 24 and 6 <= sketch_bits <= 28
        self._door = bytearray(1 << (door_bits - 3))
        self._door_blocks = (1 << (door_bits - 9)) - 1
        self._counts = bytearray(1 << sketch_bits)
        self._count_blocks = (1 << (sketch_bits - 6)) - 1
        # Reads counted after which the doorkeeper is cleared and counts halve.
        self.sample = sample
        self._added = 0

    def add(self, key: bytes) -> int:
        """Count one read of ``key``; its reads lately, this one included.

        The first read after a reset counts 1 whatever came before it: the
        sketch is not consulted for a key the doorkeeper does not know, the
        path of every read of a document not read lately.
        """
        digest = hash(key)
        first, second, third = _positions(digest)
        if self._let_in(digest, first, second, third):
            self._tick()
            return 1
        counts = self._counts
        block = self._count_block(digest)
        first, second, third = block + (first & 63), block + (second & 63), block + (third & 63)
        low = min(counts[first], counts[second], counts[third])
        if low < MAX_COUNT:
            # Only the counters at the least go up (the "conservative update"):
            # a higher one holds another key's reads too, and stays a closer bound.
            if counts[first] == low:
                counts[first] = low + 1
            if counts[second] == low:
                counts[second] = low + 1
            if counts[third] == low:
                counts[third] = low + 1
            low += 1
        self._tick()
        return low + 1

    def count(self, key: bytes) -> int:
        """``key``'s reads lately: never fewer than since the last reset.

        Its halved count from before the reset counts too, whether or not it
        was read since: an entry read often is not outweighed by a newcomer
        read twice just because the doorkeeper was cleared in between.
        """
        digest = hash(key)
        positions = _positions(digest)
        door, block = self._door, self._door_block(digest)
        seen = all(door[block + (position >> 3)] & (1 << (position & 7)) for position in positions)
        counts, block = self._counts, self._count_block(digest)
        return seen + min(counts[block + (position & 63)] for position in positions)

    def _let_in(self, digest: int, first: int, second: int, third: int) -> bool:
        """Set the doorkeeper's bits of ``digest``; whether any was not set yet (a first read)."""
        door, block = self._door, self._door_block(digest)
        new = False
        for position in (first, second, third):
            byte, bit = block + (position >> 3), 1 << (position & 7)
            if not door[byte] & bit:
                door[byte] |= bit
                new = True
        return new

    def _door_block(self, digest: int) -> int:
        """Where ``digest``'s block of the doorkeeper starts, in bytes."""
        return (digest & self._door_blocks) * _BLOCK

    def _count_block(self, digest: int) -> int:
        """Where ``digest``'s block of counters starts."""
        return ((digest >> _SKETCH_BLOCK_SHIFT) & self._count_blocks) * _BLOCK

    def _tick(self) -> None:
        self._added += 1
        if self._added >= self.sample:
            self._door = bytearray(len(self._door))
            self._counts = self._counts.translate(_HALVED)
            self._added = 0


def _positions(digest: int) -> Tuple[int, int, int]:
    """A key's three positions in its block: bits of the doorkeeper's (0-511), their low 6 the sketch's."""
    return (digest >> 15) & 511, (digest >> 24) & 511, (digest >> 33) & 511
