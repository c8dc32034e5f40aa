"""cache.redis.sentinel_watch: a graceful failover (``SENTINEL FAILOVER``) under load loses no acknowledged write.

After ``SENTINEL FAILOVER`` the old master stays a writable master for
seconds, until the sentinels make it a replica of the new one (which
throws away whatever was written to it meanwhile). Jetway's connections
opened before the failover used to keep writing there: acknowledged writes
lost, reads alternating between the two servers. One master, one replica,
three sentinels (``tests.multinode``), 2 workers, no write concern, no hot
cache (so every read is Redis's answer): writers PUT new documents and
replace one document with growing versions while readers read it back;
``SENTINEL FAILOVER`` in the middle, and the load kept on until the old
master is a replica. Runs only under ``make test-cluster``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import time
from dataclasses import dataclass
from typing import Iterator, List, Tuple

import pytest
import redis
import requests

from cache.keys import document_key
from tests.multinode import SERVICE, TOPOLOGY, SentinelServers
from tests.support import ClientThreads, JetwayServer, wait_until

JSON = {"Content-Type": "application/json"}
WORKERS = 2
pytestmark = pytest.mark.skipif(TOPOLOGY == "single", reason="multi-node: run by make test-cluster")


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
    server = JetwayServer(group.url, tmp_path / "jetway.log", env=env, auth=True)
    try:
        yield server.start(["--workers", str(WORKERS)])
    finally:
        server.stop()


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    client: int
    kind: str  # "new", "version" or "read"
    status: int
    retry_after: str
    value: str  # the document's id (new), the version written or read


class Load(ClientThreads):
    """2 clients PUT new documents, 1 replaces ``versioned`` with versions 1, 2, ..., 2 read it back."""

    def __init__(self, gateway: JetwayServer, token: str) -> None:
        super().__init__(5)
        self.gateway = gateway
        self.token = token
        self.calls: List[Call] = []

    def run_client(self, number: int) -> None:
        session = requests.Session()  # keep-alive: a reader stays on one worker
        session.headers.update({**JSON, "Authorization": f"Bearer {self.token}"})
        count = 0
        while not self.stopping.is_set():
            count += 1
            kind = "new" if number < 2 else "version" if number == 2 else "read"
            path = f"/v1/switch/n{number}-{count}" if kind == "new" else "/v1/switch/versioned"
            started = time.monotonic()
            value = f"n{number}-{count}" if kind == "new" else str(count)
            try:
                if kind == "read":
                    response = session.get(self.gateway.url(path), timeout=10)
                    if response.status_code == 200:
                        value = str(response.json()["n"])
                else:
                    response = session.put(self.gateway.url(path), data=b'{"n":%d}' % count, timeout=10)
                status, retry_after = response.status_code, response.headers.get("Retry-After", "")
            except requests.RequestException:
                status, retry_after = 0, ""
            with self.lock:
                self.calls.append(Call(started, time.monotonic(), number, kind, status, retry_after, value))


def _role(port: int) -> str:
    with redis.Redis("127.0.0.1", port, socket_timeout=5) as client:
        return client.execute_command("ROLE")[0].decode()


def _synced(port: int) -> bool:
    with redis.Redis("127.0.0.1", port, socket_timeout=5) as client:
        return client.info("replication").get("master_link_status") == "up"


def _stored(port: int, doc_ids: List[str]) -> List[bool]:
    with redis.Redis("127.0.0.1", port, socket_timeout=5) as client:
        pipe = client.pipeline(transaction=False)
        for doc_id in doc_ids:
            pipe.hget(document_key(b"switch", doc_id.encode()), "b")
        return [value is not None for value in pipe.execute()]


def _newest_before(ended: List[float], newest: List[int], moment: float) -> int:
    """The newest version acknowledged before ``moment`` (0: none)."""
    index = bisect.bisect_left(ended, moment)
    return newest[index - 1] if index else 0


def _backwards(reads: List[Tuple[float, int]]) -> int:
    """Reads of one client that returned an older version than the one it read before."""
    return sum(1 for (_, before), (_, after) in zip(reads, reads[1:]) if after < before)


@pytest.mark.parametrize("sentinel_killed", [False, True], ids=["three-sentinels", "one-sentinel-dead"])
def test_a_graceful_failover_loses_no_acknowledged_write_and_no_read_goes_back(group, gateway, sentinel_killed):
    """Also with one of the three sentinels killed first: the workers hear the others (the leader among them)."""
    token = gateway.make_token("switcher", "admin")
    old = group.current_master()
    new = group.replica if old is group.master else group.master
    wait_until(lambda: _synced(new.port), 30, "the replica to be in sync")
    headers = {**JSON, "Authorization": f"Bearer {token}"}
    first = requests.put(gateway.url("/v1/switch/versioned"), data=b'{"n":0}', headers=headers, timeout=10)
    assert first.status_code == 201
    with Load(gateway, token) as load:
        time.sleep(2.0)
        if sentinel_killed:
            group.sentinels[2].kill()
            time.sleep(1.0)
        with group.sentinels[0].client() as sentinel:
            assert sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
        failed_over = time.monotonic()
        wait_until(lambda: group.master_address()[1] == new.port, 30, "the sentinels to name the new master")
        switched = time.monotonic()
        # The old master is still a writable master here; a write that reached it now would be lost.
        time.sleep(1.0)
        wait_until(lambda: _role(old.port) == "slave", 30, "the sentinels to make the old master a replica")
        demoted = time.monotonic()
        wait_until(lambda: _synced(old.port), 30, "the old master to resync from the new one")
        time.sleep(1.0)
    calls = load.calls
    statuses = sorted({call.status for call in calls})
    failed = [call for call in calls if call.status not in (200, 201)]

    acknowledged = [call.value for call in calls if call.kind == "new" and call.status in (200, 201)]
    missing = [doc for doc, here in zip(acknowledged, _stored(new.port, acknowledged)) if not here]
    versions = [int(call.value) for call in calls if call.kind == "version" and call.status in (200, 201)]
    with redis.Redis("127.0.0.1", new.port, socket_timeout=5) as client:
        final = client.hget(document_key(b"switch", b"versioned"), "b")
    stored = json.loads(final)["n"] if final else 0
    # A read started after version v was acknowledged returns v or later, and no client reads a version
    # older than one it read before.
    acks = sorted((call.ended, int(call.value)) for call in calls if call.kind == "version" and call.status == 200)
    ended, newest = [end for end, _ in acks], list(itertools.accumulate([v for _, v in acks], max))
    reads = [call for call in calls if call.kind == "read" and call.status == 200]
    stale = [call for call in reads if int(call.value) < _newest_before(ended, newest, call.started)]
    backwards = sum(_backwards([(c.started, int(c.value)) for c in reads if c.client == client]) for client in (3, 4))
    print(
        f"\nSENTINEL FAILOVER under 5 clients{', a sentinel killed before' if sentinel_killed else ''}: "
        f"new master named {switched - failed_over:.1f} s after it, "
        f"old master a replica {demoted - failed_over:.1f} s after it; {len(failed)} of {len(calls)} requests "
        f"answered 503 (statuses {statuses}); {len(missing)} of {len(acknowledged)} acknowledged new documents "
        f"missing on the new master; last acknowledged version {max(versions)}, stored {stored}; "
        f"{len(stale)} of {len(reads)} reads older than a version acknowledged before they started, "
        f"{backwards} older than the one their client read before"
    )
    assert {call.status for call in failed} <= {503}, statuses
    assert all(call.retry_after for call in failed)
    assert missing == []
    assert stored >= max(versions)
    assert stale == [] and backwards == 0
