"""The worker sweeping a collection's expiries is killed (-9) just before they are due: another takes its lease over,
and every expiry still arrives in the feed once, within the bound docs/api.md states for a worker's death
(cache/documents/expiry.py: the lease lapses in 3 s, then the next tick of any worker sweeps).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Dict, Iterator, List

import pytest
import requests

from cache import keys
from tests.support import JetwayServer, RedisServer, wait_until, worker_pids

COLLECTION = b"leased"
TTL = 3
# The stated bound after a sweeping worker dies: its expiry + 3 s (the lease) + 1 s; asserted with slack (two shared
# cores, and a worker restarting beside the one that takes over).
BOUND_MS = 4000 + 2000


@pytest.fixture
def served(own_redis: RedisServer, tmp_path) -> Iterator[JetwayServer]:
    server = JetwayServer(own_redis.url, tmp_path / "jetway.log")
    try:
        server.start(["--workers", "2"])
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "two workers")
        yield server
    finally:
        server.stop()


def events(client, op: bytes) -> Dict[bytes, List[int]]:
    """Each document's ``op`` events' stream times (ms, Redis's clock)."""
    found: Dict[bytes, List[int]] = {}
    for shard in range(keys.INDEX_SHARDS):
        for stream_id, fields in client.xrange(keys.feed_key(COLLECTION, shard)):
            if fields[b"o"] == op:
                found.setdefault(fields[b"i"], []).append(int(stream_id.split(b"-")[0]))
    return found


def redis_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_expiries_all_arrive_once_after_the_sweeping_worker_is_killed(own_redis, served) -> None:
    client = own_redis.client()
    settings = {"indexes": {"by_status": {"fields": [{"name": "status", "pointer": "/status", "type": "string"}]}}}
    answer = requests.put(served.url(f"/v1/_collections/{COLLECTION.decode()}"), json=settings, timeout=10)
    assert answer.status_code in (200, 201), answer.text
    ids = [f"d{n:04d}" for n in range(1000)]
    for at in range(0, len(ids), 100):
        operations = [
            {"op": "put", "collection": COLLECTION.decode(), "id": doc_id, "document": {"status": "open"}, "ttl": TTL}
            for doc_id in ids[at : at + 100]
        ]
        answer = requests.post(served.url("/v1/_batch"), json={"operations": operations}, timeout=30)
        assert answer.status_code == 200, answer.text
    written = {doc_id: times[-1] for doc_id, times in events(client, b"put").items()}
    first_due = min(written.values()) + 1000 * TTL
    lease = keys.index_build_lease_key(COLLECTION, b"~expiry", b"")
    wait_until(lambda: client.get(lease) is not None, 10, "a worker to hold the expiry lease")
    # Just before the first expiry is due, the holder dies (its lease still has up to 3 s to run).
    while redis_ms(client) < first_due - 200:
        time.sleep(0.02)
    holder = int(client.get(lease).split(b":")[0])
    assert holder in worker_pids(served)
    assert not events(client, b"expire")
    os.kill(holder, signal.SIGKILL)
    deadline = time.time() + TTL + 20  # a deadline only: nothing is asserted on it
    while time.time() < deadline and len(events(client, b"expire")) < len(ids):
        time.sleep(0.2)
    told = events(client, b"expire")
    assert sorted(told) == sorted(doc_id.encode() for doc_id in ids)
    assert all(len(times) == 1 for times in told.values()), "each expiry once"
    late = {
        doc_id: told[doc_id][0] - (at + 1000 * TTL)
        for doc_id, at in written.items()
        if told[doc_id][0] - (at + 1000 * TTL) > BOUND_MS
    }
    assert not late, late
    new_holder = client.get(lease)
    assert new_holder is not None and int(new_holder.split(b":")[0]) != holder
    assert sum(client.zcard(keys.index_key(COLLECTION, shard)) for shard in range(keys.INDEX_SHARDS)) == 0
