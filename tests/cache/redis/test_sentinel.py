"""cache.redis.sentinel: Jetway behind Sentinel finds the new master by itself.

One master, one replica and three sentinels (``tests.multinode``); the
master is killed (SIGKILL) under a steady write load. Jetway may answer 503
while no master is known, never anything else, and serves again once the
sentinels have promoted the replica, with no restart; a change-feed
subscriber resumes from its last id on the promoted replica. Runs only under
``make test-cluster`` (``JETWAY_TEST_TOPOLOGY`` set): it takes a while.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Tuple

import pytest
import redis
import requests

from cache.keys import document_key
from tests.multinode import TOPOLOGY, SentinelServers
from tests.sse_client import SseClient
from tests.support import ClientThreads, JetwayServer, keys_cli, wait_until

JSON = {"Content-Type": "application/json"}
REDIS_TIMEOUT = 1.0
WRITERS = 4
WORKERS = 2
pytestmark = pytest.mark.skipif(TOPOLOGY == "single", reason="multi-node: run by make test-cluster")


@pytest.fixture
def group(tmp_path) -> Iterator[SentinelServers]:
    servers = SentinelServers(tmp_path / "sentinel")
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def gateway(group: SentinelServers, tmp_path) -> Iterator[JetwayServer]:
    env = {"JETWAY_REDIS_TIMEOUT": str(REDIS_TIMEOUT)}
    server = JetwayServer(group.url, tmp_path / "jetway.log", env=env, auth=True)
    try:
        yield server.start(["--workers", str(WORKERS)])
    finally:
        server.stop()


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    status: int
    retry_after: str
    doc_id: str


class Writers(ClientThreads):
    """``WRITERS`` clients, each PUTting new documents back to back."""

    def __init__(self, gateway: JetwayServer, token: str) -> None:
        super().__init__(WRITERS)
        self.gateway = gateway
        self.token = token
        self.calls: List[Call] = []

    def run_client(self, number: int) -> None:
        session = requests.Session()
        session.headers.update({**JSON, "Authorization": f"Bearer {self.token}"})
        count = 0
        while not self.stopping.is_set():
            count += 1
            doc_id = f"w{number}-{count}"
            started = time.monotonic()
            try:
                response = session.put(self.gateway.url(f"/v1/failover/{doc_id}"), data=b'{"n":1}', timeout=10)
                status, retry_after = response.status_code, response.headers.get("Retry-After", "")
            except requests.RequestException:
                status, retry_after = 0, ""
            with self.lock:
                self.calls.append(Call(started, time.monotonic(), status, retry_after, doc_id))

    def since(self, moment: float) -> List[Call]:
        with self.lock:
            return [call for call in self.calls if call.started >= moment]


def test_killing_the_master_costs_503s_for_the_failover_window_only(group, gateway):
    token = gateway.make_token("writer", "admin")
    old_master = group.current_master()
    wait_until(lambda: old_master.subscribers() == WORKERS, 10, "the token caches to subscribe on the master")
    with Writers(gateway, token) as writers:
        time.sleep(2.0)
        killed = time.monotonic()
        old_master.kill()
        wait_until(lambda: group.master_address()[1] != old_master.port, 30, "the sentinels to promote the replica")
        promoted = time.monotonic()
        # Recovered: three seconds of nothing but successes.
        wait_until(lambda: _recovered(writers.since(time.monotonic() - 3.0), killed), 30, "writes to succeed again")
    calls = writers.calls
    failed = [call for call in calls if call.status not in (200, 201)]
    assert {call.status for call in failed} <= {503}, sorted({call.status for call in failed})
    assert all(call.retry_after for call in failed)
    assert all(call.started >= killed - REDIS_TIMEOUT for call in failed), "a failure before the kill"
    window = max(call.ended for call in failed) - killed if failed else 0.0
    assert window < 15.0

    # Whatever Jetway acknowledged is on the new master, except what the old
    # one had not yet passed to its replica (replication is asynchronous).
    acknowledged = [call.doc_id for call in calls if call.status == 201]
    client = group.client()
    try:
        missing = [doc_id for doc_id in acknowledged if not _stored(client, doc_id)]
    finally:
        client.close()
    acknowledged_after = [call for call in calls if call.status == 201 and call.started > killed]
    assert acknowledged_after and not set(missing) & {call.doc_id for call in acknowledged_after}
    print(
        f"\nsentinel failover under {WRITERS} writers: master killed, replica promoted after "
        f"{promoted - killed:.1f}s; Jetway answered 503 for {window:.1f}s after the kill "
        f"({len(failed)} of {len(calls)} requests failed, all 503); "
        f"{len(missing)} of {len(acknowledged)} acknowledged writes missing on the new master"
    )

    # Every worker's hot cache tracks the new master: a change made there
    # straight away is read back at once by every worker.
    new_master = group.current_master()
    wait_until(lambda: new_master.trackers() == WORKERS, 10, "the hot caches to track the new master")
    assert_hot_cache_follows(gateway, token, lambda key, etag: new_master.client().hset(key, "e", etag))

    # Every worker's token cache subscribed again, on the new master, and a
    # revocation made through it reaches the workers.
    wait_until(lambda: new_master.subscribers() == WORKERS, 10, "the token caches to subscribe on the new master")
    assert keys_cli(group.url, "revoke", "writer").returncode == 0
    wait_until(lambda: _status(gateway, token) == 401, 2, "the revoked token to be refused")


class Follower(threading.Thread):
    """Follows a change feed as a browser's EventSource would: reconnecting with ``Last-Event-ID`` after any end."""

    def __init__(self, gateway: JetwayServer, token: str, collection: str) -> None:
        super().__init__()
        self.port, self.token, self.collection = gateway.port, token, collection
        self.position = ""
        self.events: List[Tuple[str, str]] = []  # (document, ETag), as received
        self.endings: Counter = Counter()  # how each stream ended: a named event, a status, a close
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stopping.is_set():
            headers = {"Authorization": f"Bearer {self.token}"}
            if self.position:
                headers["Last-Event-ID"] = self.position
            try:
                with SseClient(self.port, f"/v1/_changes/{self.collection}", headers, timeout=2.0) as client:
                    if client.response.status != 200:
                        self.endings[f"status {client.response.status}"] += 1
                        time.sleep(0.2)
                        continue
                    self._read(client)
            except (OSError, TimeoutError):
                self.endings["closed"] += 1
                time.sleep(0.2)

    def _read(self, client: SseClient) -> None:
        while not self.stopping.is_set():
            try:
                event = client.next_event()
            except TimeoutError:
                continue  # idle: no write lately
            if event is None:
                self.endings["closed"] += 1
                return
            if event.name == "ready":
                self.position = self.position or event.id or ""
            elif event.name != "message":
                self.endings[event.name] += 1
                return
            else:
                change = event.json()
                with self.lock:
                    self.events.append((change["id"], change["etag"]))
                self.position = event.id or self.position

    def seen(self) -> int:
        with self.lock:
            return len(self.events)


def test_a_feed_subscriber_resumes_from_its_last_id_on_the_promoted_replica(group, gateway):
    """Writes replicated, the master killed: a client that stays connected (reconnecting by itself with its
    last id whenever a stream ends) gets every write before and after the failover once, in each document's
    order, and one that was away resumes on the promoted replica from the id the old master gave it."""
    token = gateway.make_token("feeder", "admin")
    headers = {**JSON, "Authorization": f"Bearer {token}"}
    docs = [f"d{n}" for n in range(8)]
    acknowledged: Dict[str, List[str]] = {doc: [] for doc in docs}

    def write(rounds: int) -> None:
        for k in range(rounds):
            for doc in docs:
                url = gateway.url(f"/v1/failfeed/{doc}")
                response = requests.put(url, data=b'{"k":%d}' % k, headers=headers, timeout=10)
                assert response.status_code in (200, 201), response.text
                acknowledged[doc].append(response.headers["ETag"])

    follower = Follower(gateway, token, "failfeed")
    follower.start()
    try:
        wait_until(lambda: follower.position != "", 10, "the stream to be ready")
        write(10)
        old_master = group.current_master()
        with old_master.client() as client:
            assert client.execute_command("WAIT", 1, 5000) == 1  # the replica has every write so far
        wait_until(lambda: follower.seen() == 80, 10, "the events before the failover")
        before_the_kill = follower.position
        old_master.kill()
        wait_until(lambda: group.master_address()[1] != old_master.port, 30, "the sentinels to promote the replica")
        probe = gateway.url("/v1/failprobe/p")

        def both_workers_write() -> bool:  # fresh connections: each worker has found the new master
            return all(
                requests.put(probe, data=b"{}", headers=headers, timeout=10).status_code in (200, 201)
                for _ in range(20)
            )

        wait_until(both_workers_write, 30, "writes to succeed on the new master")
        write(10)
        wait_until(lambda: follower.seen() >= 160, 30, "the events after the failover")
        time.sleep(0.5)  # anything more (a repeat) would arrive now
    finally:
        follower.stopping.set()
        follower.join(10)
    received: Dict[str, List[str]] = {doc: [] for doc in docs}
    for doc, etag in follower.events:
        received[doc].append(etag)
    assert received == acknowledged

    # A client that was away during the failover comes back with the id it last had from the old master.
    resume = {"Authorization": f"Bearer {token}", "Last-Event-ID": before_the_kill}
    with SseClient(gateway.port, "/v1/_changes/failfeed", resume) as client:
        assert client.response.status == 200, client.response
        assert client.next_event().id == before_the_kill  # ready, where it resumes from
        after = [event.json() for event in client.events(80)]
        with pytest.raises(TimeoutError):
            client.next_event(timeout=0.5)  # nothing more: no repeat
    resumed: Dict[str, List[str]] = {doc: [] for doc in docs}
    for change in after:
        resumed[change["id"]].append(change["etag"])
    assert resumed == {doc: etags[10:] for doc, etags in acknowledged.items()}
    assert "lost" not in follower.endings, follower.endings
    endings = dict(follower.endings)
    print(f"\nfeed across a sentinel failover: 160 writes, each received once in order; streams ended: {endings}")


def assert_hot_cache_follows(gateway: JetwayServer, token: str, change: Callable[[bytes, bytes], object]) -> None:
    """A document cached by every worker, changed in Redis by ``change(key, etag)``, is read back changed at once."""
    headers = {**JSON, "Authorization": f"Bearer {token}"}
    for n in range(10):
        path, key = f"/v1/hot/d{n}", document_key(b"hot", b"d%d" % n)
        assert requests.put(gateway.url(path), data=b'{"n":1}', headers=headers, timeout=10).status_code == 201
        for _ in range(20):  # fresh connections: both workers cache it (on its second miss)
            assert requests.get(gateway.url(path), headers=headers, timeout=10).status_code == 200
        change(key, b'"changed-%d"' % n)
        etags = {requests.get(gateway.url(path), headers=headers, timeout=10).headers["ETag"] for _ in range(10)}
        assert etags == {f'"changed-{n}"'}, (path, etags)


def _recovered(recent: List[Call], killed: float) -> bool:
    after = [call for call in recent if call.started > killed]
    return len(after) > 10 and all(call.status == 201 for call in after)


def _stored(client: redis.Redis, doc_id: str) -> bool:
    return client.hget(document_key(b"failover", doc_id.encode()), "b") is not None


def _status(gateway: JetwayServer, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return requests.get(gateway.url("/v1/failover/w0-1"), headers=headers, timeout=10).status_code
