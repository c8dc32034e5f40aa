"""cache.ids: ULIDs that sort in creation order."""

import re

from cache.ids import UlidFactory


def test_ulids_are_26_crockford_characters():
    assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", UlidFactory().new())


def test_ulids_made_in_one_millisecond_still_sort_in_order():
    factory = UlidFactory(clock=lambda: 1_700_000_000.0)
    made = [factory.new() for _ in range(1000)]
    assert made == sorted(made)
    assert len(set(made)) == 1000


def test_ulids_sort_by_time_first():
    now = [1_700_000_000.0]
    factory = UlidFactory(clock=lambda: now[0])
    first = factory.new()
    now[0] += 0.001
    assert factory.new() > first
