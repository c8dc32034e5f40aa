"""Expiry as a change, through the API (cache/documents/expiry.py): an expired document leaves every index within
the bound, its ``expire`` event is in the feed, and a live query it matched is told ``matches: false``.

Runs on one Redis and on the 3-master cluster (``make test-cluster``). The bound is judged by Redis's own clock:
each event's stream time against the document's ``PEXPIRETIME`` read as it was written.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any, Dict, List

from cache import keys
from tests.handlers.test_live_queries import STATUS, live, now
from tests.handlers.test_queries import declare, query_all

# docs/api.md, "The change feed": out of every index and told within 1 s of its expiry while a sweeper runs. Asserted
# with slack (the suite shares two cores with the workers it serves from).
BOUND_MS = 2500


def feed_events(api, collection: str, since: str) -> List[Dict[str, Any]]:
    """Every event of the plain feed after ``since``."""
    events: List[Dict[str, Any]] = []
    while True:
        page = api.get(f"/v1/_changes/{collection}?since={since}&limit=500")
        assert page.status_code == 200, page.text
        events += page.json()["events"]
        if not page.json()["events"]:
            return events
        since = page.json()["next"]


def stream_times(redis_client, collection: bytes, op: bytes = b"expire") -> Dict[bytes, int]:
    """Each ``op`` event's stream time (ms, Redis's clock), by document id (the last one's)."""
    times = {}
    for shard in range(keys.INDEX_SHARDS):
        for stream_id, fields in redis_client.xrange(keys.feed_key(collection, shard)):
            if fields[b"o"] == op:
                times[fields[b"i"]] = int(stream_id.split(b"-")[0])
    return times


def test_expired_documents_leave_every_index_within_the_bound_and_each_is_told_once(api, redis_client) -> None:
    declare(api, "expiring", STATUS)
    since = now(api, "expiring")
    rng = random.Random(59)
    documents = {f"d{n:03d}": {"status": rng.choice(["open", "held"])} for n in range(300)}
    ttls = {doc_id: rng.choice([1, 2, 3]) for doc_id in documents}
    ids = sorted(documents)
    for at in range(0, 250, 50):  # most in batches, the rest one PUT each
        operations = [
            {"op": "put", "collection": "expiring", "id": doc_id, "document": documents[doc_id], "ttl": ttls[doc_id]}
            for doc_id in ids[at : at + 50]
        ]
        assert api.post_json("/v1/_batch", json.dumps({"operations": operations}).encode()).status_code == 200
    for doc_id in ids[250:]:
        answer = api.put_json(f"/v1/expiring/{doc_id}?ttl={ttls[doc_id]}", json.dumps(documents[doc_id]).encode())
        assert answer.status_code == 201, answer.text
    api.put_json("/v1/expiring/kept", b'{"status": "open"}')  # no TTL: stays
    written = stream_times(redis_client, b"expiring", b"put")
    # Each expiry by Redis's clock: its write's event time (the script's) plus its TTL.
    expiry = {doc_id: written[doc_id.encode()] + 1000 * ttls[doc_id] for doc_id in documents}
    # Wait (a deadline only, nothing asserted on it) until every expiry was told.
    deadline = time.time() + 3 + 15
    while time.time() < deadline and len(stream_times(redis_client, b"expiring")) < len(documents):
        time.sleep(0.2)
    told = stream_times(redis_client, b"expiring")
    assert sorted(told) == sorted(doc_id.encode() for doc_id in documents)
    late = {
        doc_id: told[doc_id.encode()] - at for doc_id, at in expiry.items() if told[doc_id.encode()] - at > BOUND_MS
    }
    assert not late, late
    assert all(told[doc_id.encode()] >= at - 2 for doc_id, at in expiry.items())  # never before its expiry
    events = feed_events(api, "expiring", since)
    expires = [event for event in events if event["op"] == "expire"]
    assert sorted(event["id"] for event in expires) == ids  # each once
    assert all(event["etag"] is None and event["expired_at"] for event in expires)
    # Out of every index and of the shards' id indexes: the queries and the list answer only what is left.
    assert [doc["status"] for doc in query_all(api, "expiring", "status=eq.open")] == ["open"]
    assert query_all(api, "expiring", "status=eq.held") == []
    listed = api.get("/v1/expiring?limit=1000")
    assert listed.status_code == 200, listed.text
    for shard in range(keys.INDEX_SHARDS):
        assert redis_client.zrange(keys.index_key(b"expiring", shard), 0, -1) == (
            [b"kept"] if shard == keys.shard_of(b"kept") else []
        )
        assert redis_client.zcard(keys.expiry_key(b"expiring", shard)) == 0
        assert redis_client.hlen(keys.expiry_marks_key(b"expiring", shard)) == 0
    # A live query on the open ones: each was a match, then told it no longer is, once.
    opened = [doc_id for doc_id in ids if documents[doc_id]["status"] == "open"]
    told_live = live(api, "expiring", "status=eq.open", since)
    expected = sorted([(doc_id, "put", True) for doc_id in opened] + [(doc_id, "expire", False) for doc_id in opened])
    assert sorted(event for event in told_live if event[0] != "kept") == expected
