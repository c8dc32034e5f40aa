"""cache.hot.admission: the frequency sketch that decides which misses may fill the hot cache."""

from __future__ import annotations

import random
from collections import Counter

from cache.hot.admission import MAX_COUNT, FrequencySketch


def test_a_key_counts_its_reads_up_to_the_cap():
    sketch = FrequencySketch(sample=1 << 20)
    assert sketch.count(b"k") == 0
    counts = [sketch.add(b"k") for _ in range(MAX_COUNT + 3)]
    assert counts == [*range(1, MAX_COUNT + 2), MAX_COUNT + 1, MAX_COUNT + 1]  # the doorkeeper's one and the sketch's
    assert sketch.count(b"k") == MAX_COUNT + 1
    assert sketch.count(b"other") == 0


def test_after_sample_reads_the_doorkeeper_forgets_and_counts_halve():
    sketch = FrequencySketch(sample=100)
    for _ in range(9):  # the first read in the doorkeeper, 8 in the sketch
        sketch.add(b"k")
    for n in range(90):
        sketch.add(b"o%d" % n)
    assert sketch.count(b"k") == 9
    sketch.add(b"o90")  # the hundredth read resets
    assert sketch.count(b"k") == 4  # its halved count (8 // 2); the doorkeeper forgot it
    assert sketch.add(b"k") == 1  # a first read again, for the admission of a miss
    assert sketch.count(b"k") == 1 + 4
    assert sketch.add(b"k") == 6


def test_collisions_only_raise_a_count_never_lower_it():
    """512 doorkeeper bits and 64 counters (one block each) for 500 keys: every count is at least the true reads."""
    sketch = FrequencySketch(sample=1 << 30, door_bits=9, sketch_bits=6)
    reads: Counter = Counter()
    chosen = random.Random(3)
    for _ in range(2000):
        key = b"k%d" % chosen.randrange(500)
        reads[key] += 1
        sketch.add(key)
    assert all(sketch.count(key) >= min(reads[key], MAX_COUNT + 1) for key in reads)


def test_a_key_read_once_is_rarely_taken_for_one_read_twice():
    """Ten times as many keys as a default cache of 200 B documents holds, each read once."""
    sketch = FrequencySketch(sample=1 << 30)
    again = sum(sketch.add(b"jw:{bench:%02x}:d:m%d" % (n % 16, n)) > 1 for n in range(810_000))
    assert again < 810_000 // 100
