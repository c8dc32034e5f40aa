"""Expiry as a change across a Sentinel failover (cache/documents/expiry.py): ``SENTINEL FAILOVER`` just as 300
documents fall due; on the new master every expiry is carried out, its event logged once, no entry left.

The expiry record (``xe``, ``xm``) reaches the replica in the same ``MULTI``/``EXEC`` as the write that made it, so
the promoted replica holds what is due; a sweep the old master did after the last replication is lost with it and
done again on the new one. One master, one replica, three sentinels (``tests.multinode``), 2 workers. Runs only
under ``make test-cluster``.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import redis

from cache import keys
from tests.expiring import events, redis_ms, write_expiring
from tests.multinode import SERVICE, TOPOLOGY, SentinelServers
from tests.support import JetwayServer, wait_until

pytestmark = pytest.mark.skipif(TOPOLOGY == "single", reason="multi-node: run by make test-cluster")
COLLECTION = b"failing"
TTL = 3
# docs/api.md, "Expiries in the feed": after a failover, its own time plus 4 s; asserted with slack (two shared cores).
SLACK_MS = 3000


@pytest.fixture
def group(tmp_path) -> Iterator[SentinelServers]:
    # Slow to judge a master down: only the failover the test asks for, not one of a loaded machine's.
    servers = SentinelServers(tmp_path / "sentinel", down_after_ms=5000)
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def gateway(group: SentinelServers, tmp_path) -> Iterator[JetwayServer]:
    env = {"JETWAY_REDIS_TIMEOUT": "2", "JETWAY_HOT_CACHE_BYTES": "0", "JETWAY_WARM_UP": "0"}
    server = JetwayServer(group.url, tmp_path / "jetway.log", env=env)
    try:
        yield server.start(["--workers", "2"])
    finally:
        server.stop()


def _synced(port: int) -> bool:
    with redis.Redis("127.0.0.1", port, socket_timeout=5) as client:
        return client.info("replication").get("master_link_status") == "up"


def test_expiries_due_across_a_failover_are_each_carried_out_once_on_the_new_master(group, gateway) -> None:
    old = group.current_master()
    new = group.replica if old is group.master else group.master
    wait_until(lambda: _synced(new.port), 30, "the replica to be in sync")
    ids = [f"d{n:03d}" for n in range(300)]
    write_expiring(gateway.url, COLLECTION, ids, TTL)
    with redis.Redis("127.0.0.1", old.port, socket_timeout=5) as client:
        written = {doc_id: times[-1] for doc_id, times in events(client, COLLECTION, b"put").items()}
        first_due = min(written.values()) + 1000 * TTL
        wait_until(lambda: _synced(new.port), 30, "the replica to be in sync")
        while redis_ms(client) < first_due - 300:
            time.sleep(0.02)
    with group.sentinels[0].client() as sentinel:
        assert sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
    failed_over = time.monotonic()
    wait_until(lambda: group.master_address()[1] == new.port, 30, "the sentinels to name the new master")
    switched_ms = (time.monotonic() - failed_over) * 1000
    with redis.Redis("127.0.0.1", new.port, socket_timeout=5) as client:
        deadline = time.time() + TTL + 30  # a deadline only: nothing is asserted on it
        while time.time() < deadline and len(events(client, COLLECTION, b"expire")) < len(ids):
            time.sleep(0.2)
        told = events(client, COLLECTION, b"expire")
        leftovers = {
            "ids": sum(client.zcard(keys.index_key(COLLECTION, shard)) for shard in range(keys.INDEX_SHARDS)),
            "xe": sum(client.zcard(keys.expiry_key(COLLECTION, shard)) for shard in range(keys.INDEX_SHARDS)),
            "xm": sum(client.hlen(keys.expiry_marks_key(COLLECTION, shard)) for shard in range(keys.INDEX_SHARDS)),
            "entries": sum(len(client.keys(b"ji:{%s:%02x}:x:by_status:*" % (COLLECTION, s))) for s in range(16)),
        }
    lags = sorted(times[0] - (written[doc_id] + 1000 * TTL) for doc_id, times in told.items())
    print(
        f"\nexpiries across SENTINEL FAILOVER: new master named {switched_ms:.0f} ms after it; "
        f"{len(told)} of {len(ids)} told on the new master, {lags[0]}-{lags[-1]} ms after their expiry"
    )
    assert sorted(told) == sorted(doc_id.encode() for doc_id in ids)
    assert all(len(times) == 1 for times in told.values()), "each expiry once on the new master"
    assert leftovers == {"ids": 0, "xe": 0, "xm": 0, "entries": 0}
    assert lags[-1] <= switched_ms + 4000 + SLACK_MS
