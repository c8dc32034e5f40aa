"""cache.hot.cache: the bound, the recency order, and the rule that no fill outlives what could change it.

These drive the cache by hand, in the order a worker sees events; the
same rule against a real Redis, with the order made certain by holding a
reply back, is in tests/cache/test_tracking.py.
"""

from __future__ import annotations

import random
from typing import List, Optional

import pytest

from cache.documents.store import Document
from cache.hot.cache import ENTRY_OVERHEAD, HEAP_GROWTH, MAX_ENTRY_SHARE, HotCache, document_size


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def doc(body: bytes = b'{"a":1}', etag: bytes = b'"e1"') -> Document:
    return Document(body, etag, b"Mon, 23 Nov 2026 10:00:00 GMT")


def live_cache(max_bytes: int = 1 << 20, clock: Optional[Clock] = None) -> HotCache:
    """A live cache whose entries may hold ``max_bytes``."""
    cache = HotCache(int(max_bytes * HEAP_GROWTH + 1), clock or Clock())
    assert cache.max_bytes == max_bytes
    cache.up()
    return cache


def read(cache: HotCache, key: bytes, document: Document, pttl: int = -1) -> Optional[int]:
    """A miss of ``key`` read from Redis with nothing between send and reply; the ticket, if it was let in."""
    assert cache.get(key) is None
    return read_missed(cache, key, document, pttl)


def cached(cache: HotCache, key: bytes, document: Document, pttl: int = -1) -> None:
    """Read until cached: a key not yet cached is let in on its second miss while the cache has room."""
    assert read(cache, key, document, pttl) is None
    assert read(cache, key, document, pttl) is not None
    assert cache.get(key) is document


def test_a_key_fills_on_its_second_miss_and_is_then_served_as_the_same_object():
    cache = live_cache()
    document = doc()
    assert read(cache, b"k", document) is None  # the first miss only marks the key
    assert cache.get(b"k") is None
    assert read(cache, b"k", document) is not None
    assert cache.get(b"k") is document
    assert (cache.hits, cache.misses) == (1, 3)


def test_nothing_is_reserved_filled_or_served_while_the_feed_is_down():
    cache = HotCache(1 << 20, Clock())
    document = doc()
    for _ in range(3):
        assert read(cache, b"k", document) is None
    cache.up()
    cached(cache, b"k", document)
    cache.down()
    assert cache.get(b"k") is None and len(cache) == 0 and cache.bytes == 0


def test_the_bound_holds_and_the_least_recently_used_goes_first():
    keys = [b"k%03d" % n for n in range(101)]
    size = document_size(doc(), keys[0])
    cache = live_cache(max_bytes=100 * size + size // 2)  # room for 100 (all keys are as long)
    for key in keys[:100]:
        cached(cache, key, doc())
    assert cache.get(keys[0]) is not None  # k000 is now the most recent; k001 the least
    # The cache is full: a newcomer is let in once read more often lately than
    # the entry it would push out, by more than one read (k001: missed twice
    # and read once cached, 3).
    assert [read(cache, keys[100], doc()) is not None for _ in range(5)] == [False, False, False, False, True]
    assert cache.refused_admissions == 3
    assert cache.get(keys[1]) is None
    assert all(cache.get(key) is not None for key in (keys[0], *keys[2:]))
    assert cache.bytes <= cache.max_bytes and cache.evictions == 1


def test_the_bound_is_on_the_workers_memory_and_the_entries_keep_to_a_share_of_it():
    cache = HotCache(90 * 1024 * 1024)
    assert cache.max_bytes == int(90 * 1024 * 1024 / HEAP_GROWTH) < 40 * 1024 * 1024
    assert cache.max_entry == cache.max_bytes // MAX_ENTRY_SHARE


def test_an_entry_over_its_share_of_the_bound_is_never_cached():
    cache = live_cache(max_bytes=MAX_ENTRY_SHARE * 1000)
    small = doc(b"x" * (1000 - ENTRY_OVERHEAD - 100))
    large = doc(b"x" * 1000)
    cached(cache, b"small", small)
    read(cache, b"large", large)
    read(cache, b"large", large)
    assert cache.get(b"large") is None


def test_size_counts_every_bytes_field_of_the_document_so_new_fields_count_too():
    document = doc(b"x" * 100, b'"etag"')
    assert document_size(document, b"key") == 100 + 6 + len(document.last_modified) + 3 + ENTRY_OVERHEAD


def test_size_counts_the_stored_compressed_variants_bytes():
    plain = doc(b"x" * 100, b'"etag"')
    gzipped = Document(plain.body, plain.etag, plain.last_modified, (("gzip", b"z" * 40),))
    assert document_size(gzipped, b"key") == document_size(plain, b"key") + 40


def test_an_invalidation_between_send_and_reply_refuses_the_fill():
    cache = live_cache()
    read(cache, b"k", doc())
    ticket = cache.reserve(b"k")  # the read is sent...
    cache.invalidate([b"k"])  # ...Redis's invalidation comes first...
    cache.fill(b"k", ticket, doc(etag=b'"old"'), -1)  # ...then the reply, with the old bytes
    assert cache.get(b"k") is None and cache.refused_fills == 1


def test_an_invalidation_of_another_key_does_not_refuse_the_fill():
    cache = live_cache()
    read(cache, b"k", doc())
    ticket = cache.reserve(b"k")
    cache.invalidate([b"other"])
    cache.fill(b"k", ticket, doc(), -1)
    assert cache.get(b"k") is not None


@pytest.mark.parametrize(
    "between",
    [
        pytest.param(lambda cache: cache.written(b"k"), id="this worker's own write"),
        pytest.param(lambda cache: cache.invalidate(None), id="a flush"),
        pytest.param(lambda cache: (cache.down(), cache.up()), id="the feed lost and back"),
        pytest.param(lambda cache: cache.reset(), id="a topology change"),
        pytest.param(lambda cache: cache.void(), id="a redirection"),
    ],
)
def test_anything_that_may_change_the_key_between_send_and_reply_refuses_the_fill(between):
    cache = live_cache()
    read(cache, b"k", doc())
    ticket = cache.reserve(b"k")
    between(cache)
    cache.fill(b"k", ticket, doc(), -1)
    assert cache.get(b"k") is None


def test_a_read_sent_after_the_invalidation_fills_though_an_older_one_of_the_same_key_was_refused():
    cache = live_cache()
    read(cache, b"k", doc())
    old = cache.reserve(b"k")
    cache.invalidate([b"k"])
    new = cache.reserve(b"k")  # sent after the invalidation: it reads the new bytes
    fresh = doc(etag=b'"new"')
    cache.fill(b"k", new, fresh, -1)  # its reply may even come first
    cache.fill(b"k", old, doc(etag=b'"old"'), -1)
    assert cache.get(b"k") is fresh


def test_a_failed_read_gives_its_ticket_back_and_leaves_no_bookkeeping():
    cache = live_cache()
    read(cache, b"k", doc())
    tickets: List[int] = [cache.reserve(b"k") for _ in range(3)]
    for ticket in tickets:
        cache.release(b"k", ticket)
    assert cache._pending == {}


def test_an_invalidation_or_a_write_drops_the_entry_and_a_flush_drops_all():
    cache = live_cache()
    for key in (b"a", b"b", b"c"):
        cached(cache, key, doc())
    cache.invalidate([b"a"])
    cache.written(b"b")
    assert cache.get(b"a") is None and cache.get(b"b") is None and cache.get(b"c") is not None
    cache.invalidate(None)
    assert len(cache) == 0 and cache.bytes == 0 and cache.live


def test_an_entry_is_not_served_past_the_expiry_read_with_it():
    clock = Clock()
    cache = live_cache(clock=clock)
    cached(cache, b"k", doc(), pttl=1500)
    clock.now += 1.4
    assert cache.get(b"k") is not None
    clock.now += 0.2
    assert cache.get(b"k") is None and len(cache) == 0


def test_a_key_missing_in_redis_is_not_cached():
    cache = live_cache()
    read(cache, b"k", None)
    ticket = cache.reserve(b"k")
    cache.fill(b"k", ticket, None, -2)
    assert len(cache) == 0


def fill_with_keys_read_twice(cache: HotCache, document: Document, prefix: bytes) -> List[bytes]:
    """Keys missed twice each until the cache is full (and a few more); those it holds."""
    holds = cache.max_bytes // document_size(document, prefix + b"00000")
    for n in range(holds + 10):
        key = prefix + b"%05d" % n
        for _ in range(2):
            read(cache, key, document)
    assert len(cache) == holds
    return [key for key in cache._entries]


def test_a_full_cache_does_not_swap_its_entries_for_keys_read_no_more_often():
    """More keys read in turn than the cache holds: letting them in would evict each before its next read."""
    cache = live_cache()
    document = doc()
    held = fill_with_keys_read_twice(cache, document, b"k")
    cycle = [b"c%05d" % n for n in range(2 * len(held))]
    for _ in range(3):
        for key in held:  # the cache's own keys read in turn too
            cache.get(key)
        for key in cycle:
            if cache.get(key) is None:
                read_missed(cache, key, document)
    assert cache.evictions <= len(cycle) // 100  # but for the odd hash colliding with a held key's
    assert sum(cache.get(key) is document for key in held) >= len(held) - len(cycle) // 100
    assert cache.refused_admissions >= len(cycle)  # read twice lately, and turned away
    # A key read more often than the entry it would push out is let in.
    reads = 1
    while read(cache, b"hot", document) is None and reads < 15:
        reads += 1
    assert reads < 15
    assert cache.get(b"hot") is document


def test_random_reads_of_more_keys_than_the_cache_holds_rarely_fill():
    """Read at random, any third of the keys is as good as another: churning them saves nothing."""
    cache = live_cache()
    document = doc()
    holds = cache.max_bytes // document_size(document, b"k00000")
    keys = [b"k%05d" % n for n in range(3 * holds)]
    chosen = random.Random(7)
    for _ in range(30 * holds):
        key = keys[chosen.randrange(len(keys))]
        if cache.get(key) is None:
            read_missed(cache, key, document)
    assert cache.hits / (cache.hits + cache.misses) > 0.28  # about the third it holds
    assert cache.evictions < cache.misses // 5  # each LRU fill of a miss evicted one


def read_missed(cache: HotCache, key: bytes, document: Document, pttl: int = -1) -> Optional[int]:
    """``read`` after a ``get`` that missed (and counted the miss); the ticket, if it was let in."""
    ticket = cache.reserve(key)
    if ticket is not None:
        cache.fill(key, ticket, document, pttl)
    return ticket


def test_hit_counts_only_hits_and_leaves_a_miss_to_get():
    """The direct read asks ``hit`` first and the handler's ``get`` after it: a miss is counted once, by ``get``."""
    clock = Clock()
    cache = live_cache(clock=clock)
    document = doc()
    cached(cache, b"k", document, pttl=1000)
    hits, misses = cache.hits, cache.misses
    assert cache.hit(b"k") is document and (cache.hits, cache.misses) == (hits + 1, misses)
    assert cache.hit(b"other") is None and (cache.hits, cache.misses) == (hits + 1, misses)
    clock.now += 1.0  # past the expiry read with it
    assert cache.hit(b"k") is None and len(cache) == 1 and cache.misses == misses  # held, not served
    assert cache.get(b"k") is None and len(cache) == 0 and cache.misses == misses + 1


def test_with_a_bound_on_the_lag_an_entry_is_served_only_until_the_last_confirmation_plus_the_bound():
    """``confirm(t)``: every invalidation of a write Redis ran before t has arrived; hits are served until
    t + max_lag, then refused (counted as lagging) with the entry kept; the feed going down forgets it."""
    clock = Clock()
    cache = HotCache(1 << 20, clock, max_lag=0.05)
    cache.up()
    document = doc()
    assert read(cache, b"k", document) is None
    assert read(cache, b"k", document) is not None  # fills, though nothing is confirmed yet
    assert cache.hit(b"k") is None and cache.lagging == 1 and not cache.fresh
    cache.confirm(clock.now - 0.01)
    assert cache.hit(b"k") is document and cache.fresh
    clock.now += 0.04  # the confirmation's PING is now 50 ms old: still served
    assert cache.hit(b"k") is document
    clock.now += 0.001
    assert cache.hit(b"k") is None and len(cache) == 1 and cache.stats()["lagging"] == 2
    assert cache.get(b"k") is None and len(cache) == 1  # a miss, but the entry stays for when the lag is back
    cache.confirm(clock.now)
    assert cache.hit(b"k") is document
    cache.down()
    cache.up()
    cached_again = read(cache, b"k", document), read(cache, b"k", document)
    assert cached_again[1] is not None and cache.hit(b"k") is None  # not served before a new confirmation
    cache.confirm(None)
    assert cache.hit(b"k") is None
    cache.confirm(clock.now)
    assert cache.hit(b"k") is document
