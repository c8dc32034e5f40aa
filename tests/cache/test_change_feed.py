"""cache.change_feed and the write scripts: an event per write that happened, capped; a reader told what it lost.

The Lua scripts run on the suite's real redis-server, called as the store
calls them (``cache.scripts``) with the feed's arguments (``FeedLog``).
"""

from __future__ import annotations

import time
from typing import List

from cache import keys, scripts
from cache.change_feed import NO_FEED, READ, FeedLog, channel

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
