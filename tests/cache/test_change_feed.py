"""cache.feed.streams and the write scripts: an event per write that happened, capped; a reader told what it lost.

The Lua scripts run on the suite's real redis-server, called as the store
calls them (``cache.documents.scripts``) with the feed's arguments (``FeedLog``).
"""

from __future__ import annotations

import json
import time
from typing import List

from cache import keys
from cache.documents import scripts
from cache.feed.streams import MAX_EVENT_BYTES, NO_FEED, READ, FeedLog, channel

COLL = b"cf"


def put(client, doc_id: bytes, etag: bytes, feed: FeedLog, if_match: bytes = b"", op: bytes = b"put") -> int:
    script_keys = [keys.document_key(COLL, doc_id), keys.index_key_for(COLL, doc_id), *feed.script_keys(COLL, doc_id)]
    args = [doc_id, b"{}", etag, b"date", b"0", if_match, b"", 0, 0, b"", *feed.script_args(op, COLL, doc_id)]
    return client.eval(scripts.PUT.source, len(script_keys), *script_keys, *args)


def delete(client, doc_id: bytes, feed: FeedLog) -> int:
    script_keys = [keys.document_key(COLL, doc_id), keys.index_key_for(COLL, doc_id), *feed.script_keys(COLL, doc_id)]
    args = [doc_id, b"", *feed.script_args(b"delete", COLL, doc_id)]
    return client.eval(scripts.DELETE.source, len(script_keys), *script_keys, *args)


def read(client, stream: bytes, after: bytes, count: int = 10) -> List:
    ms, seq = after.split(b"-")
    return client.eval(READ.source, 1, stream, ms, seq, b"+", count)


def stream_of(doc_id: bytes) -> bytes:
    return keys.feed_key(COLL, keys.shard_of(doc_id))


def test_writes_that_happen_are_events_and_nudges_and_others_are_not(redis_client):
    feed = FeedLog()
    nudges = redis_client.pubsub()
    nudges.subscribe(channel(COLL))
    assert nudges.get_message(timeout=1)["type"] == "subscribe"
    assert put(redis_client, b"a", b'"e1"', feed) == 2
    assert put(redis_client, b"a", b'"e2"', feed, if_match=b'"stale"') == 0
    assert put(redis_client, b"a", b'"e3"', feed, op=b"patch") == 1
    assert delete(redis_client, b"a", feed) == 1
    assert delete(redis_client, b"a", feed) == -1
    entries = redis_client.xrange(stream_of(b"a"))
    assert [fields for _, fields in entries] == [
        {b"o": b"put", b"i": b"a", b"e": b'"e1"'},
        {b"o": b"patch", b"i": b"a", b"e": b'"e3"'},
        {b"o": b"delete", b"i": b"a", b"e": b""},
    ]
    shard = b"%02x" % keys.shard_of(b"a")
    messages = [nudges.get_message(timeout=1) for _ in range(3)]
    assert [m["data"] for m in messages] == [shard + b" " + entry_id for entry_id, _ in entries]
    nudges.close()


def test_with_the_feed_off_a_write_logs_nothing(redis_client):
    assert put(redis_client, b"a", b'"e1"', NO_FEED) == 2
    assert delete(redis_client, b"a", NO_FEED) == 1
    assert redis_client.exists(stream_of(b"a")) == 0


def test_the_write_still_drops_variants_an_earlier_version_had(redis_client):
    feed = FeedLog()
    script_keys = [keys.document_key(COLL, b"v"), keys.index_key_for(COLL, b"v"), *feed.script_keys(COLL, b"v")]
    first = [b"v", b"{}", b'"1"', b"d", b"0", b"", b"", 1, b"g", b"zip", 0, b"", *feed.script_args(b"put", COLL, b"v")]
    redis_client.eval(scripts.PUT.source, 3, *script_keys, *first)
    assert redis_client.hget(script_keys[0], b"g") == b"zip"
    second = [b"v", b"{}", b'"2"', b"d", b"0", b"", b"", 0, 0, b"", b"g", *feed.script_args(b"put", COLL, b"v")]
    redis_client.eval(scripts.PUT.source, 3, *script_keys, *second)
    assert redis_client.hgetall(script_keys[0]) == {b"b": b"{}", b"e": b'"2"', b"m": b"d"}


def test_the_cap_trims_and_a_reader_from_before_it_is_told(redis_client):
    feed = FeedLog(max_events=16)  # one event per shard, trimmed by whole listpack nodes (100 entries)
    for n in range(350):
        put(redis_client, b"a", b'"e%d"' % n, feed)
    stream = stream_of(b"a")
    kept = redis_client.xrange(stream)
    assert len(kept) < 350 and redis_client.xinfo_stream(stream)["entries-added"] == 350
    first = kept[0][0]
    assert read(redis_client, stream, b"0-0") == [1]
    assert read(redis_client, stream, b"1-0") == [1]
    lost, entries = read(redis_client, stream, first, 2)
    assert lost == 0 and [entry[0] for entry in entries] == [kept[1][0], kept[2][0]]
    last = kept[-1][0]
    assert read(redis_client, stream, last) == [0, []]
    ms, seq = last.split(b"-")
    assert read(redis_client, stream, b"%d-0" % (int(ms) + 1)) == [1]  # ahead of the stream: lost in a failover


def test_a_missing_stream_is_empty_from_the_start_and_lost_from_anywhere_else(redis_client):
    stream = stream_of(b"nothing")
    assert read(redis_client, stream, b"0-0") == [0, []]
    assert read(redis_client, stream, b"5-0") == [1]


def test_the_age_cap_drops_older_events(redis_client):
    feed = FeedLog(max_age=1)
    for n in range(150):
        put(redis_client, b"a", b'"old%d"' % n, feed)
    time.sleep(1.2)
    for n in range(150):
        put(redis_client, b"a", b'"new%d"' % n, feed)
    etags = [fields[b"e"] for _, fields in redis_client.xrange(stream_of(b"a"))]
    assert b'"old0"' not in etags and b'"new149"' in etags


def test_a_check_only_read_returns_no_entries(redis_client):
    put(redis_client, b"a", b'"e"', FeedLog())
    assert read(redis_client, stream_of(b"a"), b"0-0", 0) == [0, []]


def test_a_write_already_carrying_its_etag_is_answered_as_done_and_logged_once(redis_client):
    """The PUT script's {3, last-modified} reply (a retry of an Idempotency-Key's plan) adds no second event."""
    feed = FeedLog()
    assert put(redis_client, b"r", b'"planned"', feed) == 2
    assert put(redis_client, b"r", b'"planned"', feed) == [3, b"date"]
    assert [fields[b"e"] for _, fields in redis_client.xrange(stream_of(b"r"))] == [b'"planned"']


def indexed_put(client, doc_id: bytes, n: int, feed: FeedLog, marked: bool = True, wide: int = 400) -> None:
    """A PUT in a shard that keeps an index on /f: its event carries the entries (``marked``: the document has f,
    ``wide`` bytes of it and more)."""
    from cache.indexes.declared import declared_indexes, index_args, spec_json
    from cache.indexes.scripts import SPEC

    indexes = declared_indexes({"i0": {"fields": [{"name": "f", "pointer": "/f", "type": "string"}]}})
    shard = keys.shard_of(doc_id)
    client.eval(SPEC.source, 1, keys.index_spec_key(COLL, shard), 1, spec_json(indexes))
    document = {"f": f"v{n}".ljust(wide, "-")} if marked else {"g": n}
    script_keys = [keys.document_key(COLL, doc_id), keys.index_key_for(COLL, doc_id), *feed.script_keys(COLL, doc_id)]
    args = [doc_id, json.dumps(document).encode(), b'"e%d"' % n, b"date", b"", b"", b"", 0]
    args += [*index_args(indexes, document, doc_id), *feed.script_args(b"put", COLL, doc_id)]
    client.eval(scripts.PUT.source, len(script_keys), *script_keys, *args)


def counted(client, doc_id: bytes) -> tuple:
    """A shard's stream length, its counts' list length, its running total and the counts' sum."""
    state = keys.feed_bytes_key(COLL, keys.shard_of(doc_id))
    sizes = [int(size) for size in client.lrange(state + b"s", 0, -1)]
    return client.xlen(stream_of(doc_id)), len(sizes), int(client.hget(state, "b") or 0), sum(sizes)


def test_a_stream_of_events_within_the_budgets_share_is_not_counted(redis_client):
    """Events with entries, each no larger than the budget over the length cap and Redis's slack: the cap bounds
    their bytes, Redis trims by whole nodes (MAXLEN ~), and nothing is counted; from the first larger one on,
    every event is."""
    roomy = FeedLog(max_events=16 * 100, max_bytes=16 * 1024 * 1024)  # a shard's share: 1 MiB / (100 + 132)
    for n in range(400):
        indexed_put(redis_client, b"a", n, roomy, wide=40)
    length, listed, total, _ = counted(redis_client, b"a")
    assert 100 <= length < 100 + 132 and (listed, total) == (0, 0)
    assert redis_client.memory_usage(stream_of(b"a"), samples=0) < 1024 * 1024
    tight = FeedLog(max_events=16 * 100, max_bytes=16 * 100 * 1024)  # a share of 441 B: an entry of 500 is over
    indexed_put(redis_client, b"a", 400, tight, wide=500)
    length, listed, total, summed = counted(redis_client, b"a")
    assert length == listed and total == summed > 0
    indexed_put(redis_client, b"a", 401, roomy, wide=40)  # small again, but the stream stays counted
    length, listed, total, summed = counted(redis_client, b"a")
    assert length == listed > 0 and total == summed > 0


def test_a_stream_with_index_entries_keeps_a_running_count_of_its_bytes_through_every_trim(redis_client):
    """``cache.documents.scripts``' trim_feed: the total is each kept event's count, after the event cap, a trim outside
    the script (the counts are made again from the events) and the age cap; a stream without entries is not
    counted (MAXLEN ~, as before). Its events are larger than the budget's share of one, so it is counted."""
    feed = FeedLog(max_events=16 * 10, max_bytes=1)  # a shard's budget is one largest event: a share of 461 B
    for n in range(50):
        put(redis_client, b"a", b'"u%d"' % n, feed)
    assert counted(redis_client, b"a") == (50, 0, 0, 0)
    for n in range(100):
        indexed_put(redis_client, b"a", n, feed)
    length, listed, total, summed = counted(redis_client, b"a")
    assert 10 <= length < 10 + 32 and listed == length and total == summed > 0
    stream = stream_of(b"a")
    redis_client.xtrim(stream, maxlen=5, approximate=False)
    indexed_put(redis_client, b"a", 200, feed)
    length, listed, total, summed = counted(redis_client, b"a")
    assert length == listed == 6 and total == summed
    aged = FeedLog(max_events=16 * 1000, max_age=1, max_bytes=1)
    time.sleep(1.1)
    indexed_put(redis_client, b"a", 300, aged)
    assert counted(redis_client, b"a")[:2] == (1, 1)  # the others were over a second old
    budget = FeedLog(max_events=16 * 1000, max_bytes=1)  # a shard's budget is then one largest event
    for n in range(400, 1400):
        indexed_put(redis_client, b"a", n, budget)
    length, listed, total, summed = counted(redis_client, b"a")
    assert length == listed and total == summed <= MAX_EVENT_BYTES and length < 1000
    assert redis_client.memory_usage(stream, samples=0) <= MAX_EVENT_BYTES + 4096  # a node's slack
