"""Acknowledged means kept: a failover after replication lag, with and without a write concern.

Sentinel, one master, one replica that reaches its master through
``tests.lag_proxy`` (so lag can be made, and made to lose data, as a bad
network does). Under a steady write load the replication stream is held
back for a second, then the master is killed and the link cut, and the
sentinels promote the replica (given a new replica of its own). Every write
answered 2xx is then looked up on the new master: with ``JETWAY_WRITE_REPLICAS=0`` the held-back writes are
gone (the test shows how many); with ``1`` none is, in every run, because
those writes were answered 503 not-replicated instead (and writes are
confirmed again once the new master has a replica).

Also a cluster: the ``WAIT`` goes to the node that took the write. Runs only
under ``make test-cluster``.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Iterator

import pytest
import redis
import requests

from cache.keys import document_key
from tests.cache.redis.test_sentinel import Writers
from tests.lag_proxy import LagProxy
from tests.multinode import TOPOLOGY, ClusterServers, RedisProcess, SentinelServers, data_args
from tests.support import JetwayServer, free_port, wait_until

pytestmark = pytest.mark.skipif(TOPOLOGY == "single", reason="multi-node: run by make test-cluster")
REDIS_TIMEOUT = 1.0
WRITE_TIMEOUT = 0.5
LAG_SECONDS = 1.0


@pytest.fixture
def lagging_group(tmp_path) -> Iterator[tuple]:
    proxy = LagProxy()
    # Sentinels would point the replica straight at the master, around the proxy, once the replica has
    # replicated from "another address" for failover-timeout (10 s by default): on a loaded machine,
    # before the lag was made (the runs that saw no lag). Longer than a run takes.
    servers = SentinelServers(tmp_path / "sentinel", upstream=proxy.port, failover_timeout_ms=120_000)
    proxy.target = servers.master.port
    proxy.start()
    try:
        yield servers.start(), proxy
    finally:
        proxy.stop()
        servers.stop()


def gateway_for(url: str, tmp_path, replicas: int) -> JetwayServer:
    env = {
        "JETWAY_REDIS_TIMEOUT": str(REDIS_TIMEOUT),
        "JETWAY_WRITE_REPLICAS": str(replicas),
        "JETWAY_WRITE_TIMEOUT": str(WRITE_TIMEOUT),
    }
    return JetwayServer(url, tmp_path / "jetway.log", env=env)


@pytest.mark.parametrize("replicas,run", [(0, 1), *((1, run) for run in range(1, 6))], ids=lambda value: str(value))
def test_a_failover_after_lag_loses_acknowledged_writes_only_without_a_write_concern(
    lagging_group, tmp_path, replicas, run
):
    group, proxy = lagging_group
    gateway = gateway_for(group.url, tmp_path, replicas).start(["--workers", "2"])
    spare = None
    try:
        with Writers(gateway, "unused") as writers:
            time.sleep(1.0)
            lag_from = time.monotonic()
            proxy.hold()
            time.sleep(LAG_SECONDS)
            killed = time.monotonic()
            group.master.kill()
            proxy.cut()
            wait_until(lambda: group.master_address()[1] != group.master.port, 30, "the sentinels to promote")
            promoted = time.monotonic()
            if replicas:
                # The promoted replica has no replica of its own: no write can be confirmed
                # until it has one. A new server, not the old master restarted: that one,
                # empty, could be taken for the master by a sentinel that missed the failover.
                # Never promoted itself (priority 0): a sentinel picks a replica still in its
                # first sync (it reports no link-down time) when the new master looks down on a
                # loaded machine, and the new master then resyncs from it, empty (stop 65's CI:
                # 418 acknowledged writes, the first ones among them, gone that way).
                port, home = free_port(), tmp_path / "spare"
                upstream = ["--replicaof", "127.0.0.1", str(group.replica.port), "--replica-priority", "0"]
                spare = RedisProcess(home, port, [*data_args(home, port), *upstream]).start()
            wait_until(lambda: _recovered(writers, killed), 30, "writes to succeed again")
    finally:
        gateway.stop()
        if spare is not None:
            spare.stop()

    calls = writers.calls
    acknowledged = [call for call in calls if call.status in (200, 201)]
    during_lag = [call for call in calls if lag_from <= call.started < killed]
    # Looked up on the replica the sentinels promoted: the only one they can promote (the spare
    # has priority 0), so a second failover would have nowhere to go.
    with group.replica.client() as client:
        missing = [call.doc_id for call in acknowledged if not _stored(client, call.doc_id)]
    statuses = Counter(call.status for call in calls if call.status not in (200, 201))
    print(
        f"\nwrite concern {replicas}, run {run}: {len(calls)} writes, {len(during_lag)} during"
        f" {LAG_SECONDS:g} s of lag ({proxy.held_bytes} bytes of replication held back);"
        f" master killed, replica promoted after {promoted - killed:.1f} s; failed {dict(statuses)};"
        f" {len(missing)} of {len(acknowledged)} acknowledged writes missing on the new master"
    )
    assert during_lag and proxy.held_bytes > 0
    if replicas == 0:
        # The lag was real: what the master acknowledged during it is gone.
        assert missing, "expected the lag to lose acknowledged writes without a write concern"
        assert set(statuses) <= {503}, statuses  # a timeout across a failover is 503 too (cache.redis.sentinel)
    else:
        assert missing == []
        assert all(call.status == 503 for call in during_lag if call.ended < killed), Counter(
            call.status for call in during_lag
        )
        assert set(statuses) <= {503}, statuses


def test_in_a_cluster_the_wait_goes_to_the_node_that_took_the_write(tmp_path):
    cluster = ClusterServers(tmp_path / "cluster", replicas=1)
    gateway = gateway_for(cluster.url, tmp_path, 1)
    frozen = None
    try:
        cluster.start()
        gateway.start(["--workers", "1"])
        doc_ids = [f"k{n}" for n in range(60)]
        assert all(_put(gateway, doc_id).status_code == 201 for doc_id in doc_ids)

        master = next(node for node in cluster.nodes if cluster.role(node) == "master")
        frozen = cluster.replica_of(master).process
        frozen.send_signal(signal.SIGSTOP)
        with master.client() as client:
            slots = _slots_of(client)
            on_master = {
                doc_id
                for doc_id in doc_ids
                if client.execute_command("CLUSTER", "KEYSLOT", document_key(b"wc", doc_id.encode())) in slots
            }
        assert on_master and len(on_master) < len(doc_ids)
        for doc_id in doc_ids:
            response = _put(gateway, doc_id)
            expected = 503 if doc_id in on_master else 200
            assert response.status_code == expected, (doc_id, response.status_code, response.content)
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        gateway.stop()
        cluster.stop()


def _put(gateway: JetwayServer, doc_id: str) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    return requests.put(gateway.url(f"/v1/wc/{doc_id}"), data=b'{"n":1}', headers=headers, timeout=10)


def _slots_of(client: redis.Redis) -> set:
    """The slots the node ``client`` talks to serves."""
    me = next(line for line in client.execute_command("CLUSTER", "NODES").decode().splitlines() if "myself" in line)
    slots = set()
    for part in me.split()[8:]:
        start, _, end = part.partition("-")
        if start.isdigit():
            slots.update(range(int(start), int(end or start) + 1))
    return slots


def _recovered(writers: Writers, killed: float) -> bool:
    after = [call for call in writers.since(time.monotonic() - 2.0) if call.started > killed]
    return len(after) > 10 and all(call.status == 201 for call in after)


def _stored(client: redis.Redis, doc_id: str) -> bool:
    return client.hget(document_key(b"failover", doc_id.encode()), "b") is not None
