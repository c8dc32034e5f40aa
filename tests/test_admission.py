"""cache.admission: the frequency sketch that decides which misses may fill the hot cache."""

from __future__ import annotations

import random
from collections import Counter

from cache.admission import MAX_COUNT, FrequencySketch


def test_a_key_counts_its_reads_up_to_the_cap():
    sketch = FrequencySketch(sample=1 << 20)
    assert sketch.count(b"k") == 0
    counts = [sketch.add(b"k") for _ in range(MAX_COUNT + 3)]
    assert counts == [*range(1, MAX_COUNT + 1), MAX_COUNT, MAX_COUNT, MAX_COUNT]
    assert sketch.count(b"k") == MAX_COUNT
    assert sketch.count(b"other") == 0


def test_every_count_halves_after_sample_additions():
    sketch = FrequencySketch(sample=100)
    for _ in range(9):
        sketch.add(b"k")
    for n in range(91):  # the hundredth addition halves
        sketch.add(b"o%d" % n)
    assert sketch.count(b"k") == 4  # 9 // 2
    assert sketch.add(b"k") == 5


def test_collisions_only_raise_a_count_never_lower_it():
    """64 counters for 500 keys: every count is at least the key's true reads."""
    sketch = FrequencySketch(sample=1 << 30, bits=6)
    reads: Counter = Counter()
    chosen = random.Random(3)
    for _ in range(2000):
        key = b"k%d" % chosen.randrange(500)
        reads[key] += 1
        sketch.add(key)
    assert all(sketch.count(key) >= min(reads[key], MAX_COUNT) for key in reads)
