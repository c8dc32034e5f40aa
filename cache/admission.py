"""How often each document was read lately: what decides which misses may fill the hot cache.

A count-min sketch (TinyLFU's): every read of a document key, a hit or a
miss, adds one to three small counters picked by the key's hash, and the
key's count is the least of the three (hashes that collide can only make a
count higher, never lower). Counts stop at ``MAX_COUNT`` and all halve
after every ``sample`` additions, so they tell how often a key was read
lately, in a fixed amount of memory whatever the number of keys.

``cache.hot_cache`` lets a miss fill only when its key was read at least
twice lately and, once the cache is full, more often than the entry the
fill would push out. A document read once costs what it costs without the
cache; and when the documents read are more than the cache holds, an entry
is not swapped for another read no more often, which cost a fill, an
eviction and garbage for PyPy's old generation, and saved nothing.
"""

from __future__ import annotations

# 1 Mi one-byte counters (1 MiB): three per key, with few collisions for the
# few hundred thousand keys a worker's cache can see between halvings.
SKETCH_BITS = 20
# A count never goes higher: enough to compare keys, and halving keeps
# recent reads ahead of old ones.
MAX_COUNT = 15
# Each counter's value once halved, for bytearray.translate (a C loop).
_HALVED = bytes(count >> 1 for count in range(256))


class FrequencySketch:
    """Recent reads per key, approximately and in ``1 << bits`` bytes."""

    def __init__(self, sample: int, bits: int = SKETCH_BITS) -> None:
        # Three counters per key from one 64-bit hash: ``bits`` bits each.
        assert 3 * bits <= 64
        self._bits = bits
        self._mask = (1 << bits) - 1
        self._counts = bytearray(1 << bits)
        # Additions after which every count halves.
        self.sample = sample
        self._added = 0

    def add(self, key: bytes) -> int:
        """Count one read of ``key``; its count now."""
        counts, mask, bits = self._counts, self._mask, self._bits
        digest = hash(key)
        first, second, third = digest & mask, (digest >> bits) & mask, (digest >> 2 * bits) & mask
        low = min(counts[first], counts[second], counts[third])
        if low >= MAX_COUNT:
            return low
        # Only the counters at the least go up (the "conservative update"):
        # a higher one holds another key's reads too, and stays a closer bound.
        if counts[first] == low:
            counts[first] = low + 1
        if counts[second] == low:
            counts[second] = low + 1
        if counts[third] == low:
            counts[third] = low + 1
        self._added += 1
        if self._added >= self.sample:
            self._counts = self._counts.translate(_HALVED)
            self._added = 0
        return low + 1

    def count(self, key: bytes) -> int:
        """``key``'s count: never less than its reads since the counts last halved."""
        counts, mask, bits = self._counts, self._mask, self._bits
        digest = hash(key)
        return min(counts[digest & mask], counts[(digest >> bits) & mask], counts[(digest >> 2 * bits) & mask])
