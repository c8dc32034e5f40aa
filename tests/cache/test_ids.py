"""cache.documents.ids: ULIDs that sort in creation order; ETags unique to every write."""

import re

from cache.documents.ids import EtagFactory, UlidFactory


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


def test_etags_are_strong_quoted_and_new_for_every_write():
    factory = EtagFactory()
    made = [factory.new() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    # RFC 9110 entity-tag: DQUOTE *etagc DQUOTE, not weak.
    assert all(re.fullmatch(rb'"[\x21\x23-\x7e]+"', etag) for etag in made)


def test_etags_of_two_processes_differ():
    # Each worker has its own factory; their random parts keep them apart.
    first, second = EtagFactory(), EtagFactory()
    assert {first.new() for _ in range(100)}.isdisjoint({second.new() for _ in range(100)})
