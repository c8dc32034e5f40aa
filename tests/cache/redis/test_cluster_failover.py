"""A Redis Cluster master killed under load: its replica takes over, Jetway follows.

Three masters with a replica each (``tests.multinode``). One master gets
SIGKILL while clients write and read through two workers. Until the
cluster promotes the replica, requests for that master's slots may fail,
with 503 or 504 and never anything else, never a hang; then Jetway finds
the new owner by itself (a MOVED, or its map reloaded after the dead node
failed it) and serves without a restart. Runs only under
``make test-cluster``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Iterator, List

import pytest
from redis.cluster import RedisCluster

from cache.keys import document_key
from tests.cache.redis.test_sentinel import Call, Writers, assert_hot_cache_follows
from tests.multinode import TOPOLOGY, ClusterServers
from tests.support import JetwayServer, SteadyClient, wait_until

REDIS_TIMEOUT = 1.0
pytestmark = pytest.mark.skipif(TOPOLOGY == "single", reason="multi-node: run by make test-cluster")


@pytest.fixture
def cluster(tmp_path) -> Iterator[ClusterServers]:
    servers = ClusterServers(tmp_path / "cluster", replicas=1)
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def gateway(cluster: ClusterServers, tmp_path) -> Iterator[JetwayServer]:
    env = {"JETWAY_REDIS_TIMEOUT": str(REDIS_TIMEOUT)}
    server = JetwayServer(cluster.url, tmp_path / "jetway.log", env=env)
    try:
        yield server.start(["--workers", "2"])
    finally:
        server.stop()


def test_a_killed_master_costs_503s_until_its_replica_is_promoted_and_no_acknowledged_write(cluster, gateway):
    victim = next(node for node in cluster.nodes if cluster.role(node) == "master")
    heir = cluster.replica_of(victim)
    with Writers(gateway, "unused") as writers, SteadyClient(gateway.base) as readers:
        time.sleep(2.0)
        killed = time.monotonic()
        victim.kill()
        wait_until(lambda: cluster.role(heir) == "master", 30, "the cluster to promote the replica")
        promoted = time.monotonic()
        wait_until(lambda: _recovered(writers.since(time.monotonic() - 3.0), killed), 30, "writes to succeed again")
    calls = writers.calls
    failed = [call for call in calls if call.status not in (200, 201)]
    statuses = Counter(call.status for call in failed)
    assert set(statuses) <= {503, 504}, statuses
    assert all(call.retry_after for call in failed if call.status == 503)
    assert all(call.started >= killed - REDIS_TIMEOUT for call in failed), "a failure before the kill"
    window = max(call.ended for call in failed) - killed if failed else 0.0
    read_failures = Counter(outcome for _, outcome in readers.failures)
    assert set(read_failures) <= {"status 503", "status 504"}, read_failures

    acknowledged = [call.doc_id for call in calls if call.status == 201]
    missing = _missing(cluster, acknowledged)
    print(
        f"\ncluster failover under 4 writers and 4 readers: master :{victim.port} killed, replica :{heir.port}"
        f" promoted after {promoted - killed:.1f}s; writes failed for {window:.1f}s after the kill"
        f" ({len(failed)} of {len(calls)}: {dict(statuses)}); reads: {readers.ok} answered,"
        f" {len(readers.failures)} failed {dict(read_failures)};"
        f" {len(missing)} of {len(acknowledged)} acknowledged writes missing"
    )
    assert window < 20.0
    assert not missing, missing[:10]

    # The hot caches track the promoted replica: a change made there (its slots
    # hold d0..d9 of "hot" or not; every master is tracked) is read back at once.
    # Up to 30 s: a tracker that lost the killed master redials on a fresh
    # topology every second, and in one CI run on this 2-core machine, where
    # the promotion itself took 5.2 s (2.2-2.3 s usually), 10 s were not enough.
    wait_until(lambda: all(_tracked(cluster, node) for node in cluster.live_nodes()), 30, "every master tracked")
    client = cluster.client()
    try:
        assert_hot_cache_follows(gateway, "", lambda key, etag: client.hset(key, "e", etag))
    finally:
        client.close()


def _tracked(cluster: ClusterServers, node) -> bool:
    """A master has both workers' tracking connections; a replica needs none."""
    return cluster.role(node) != "master" or node.trackers() == 2


def _recovered(recent: List[Call], killed: float) -> bool:
    after = [call for call in recent if call.started > killed]
    return len(after) > 10 and all(call.status == 201 for call in after)


def _missing(cluster: ClusterServers, doc_ids: List[str]) -> List[str]:
    client: RedisCluster = cluster.client()
    try:
        return [doc_id for doc_id in doc_ids if client.hget(document_key(b"failover", doc_id.encode()), "b") is None]
    finally:
        client.close()
