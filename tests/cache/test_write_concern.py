"""JETWAY_WRITE_REPLICAS: a write is answered once that many replicas have it, or 503 not-replicated.

A real master and replica (``tests.multinode.ReplicatedPair``). The replica
is stopped with SIGSTOP to make it lag: the master still sends to it, and it
confirms nothing. The failover this protects against is in
``tests/cache/test_write_concern_failover.py`` (``make test-cluster``).
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from typing import Iterator

import pytest
import requests

from cache.keys import document_key
from tests.multinode import ReplicatedPair
from tests.support import JetwayServer

WRITE_TIMEOUT = 0.3
JSON = {"Content-Type": "application/json"}
PROBLEM = "urn:jetway:problem:"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[ReplicatedPair]:
    servers = ReplicatedPair(tmp_path_factory.mktemp("replicated"))
    try:
        yield servers.start()
    finally:
        servers.stop()


def gateway(pair: ReplicatedPair, tmp_path, replicas: int, timeout: float = WRITE_TIMEOUT) -> JetwayServer:
    env = {"JETWAY_WRITE_REPLICAS": str(replicas), "JETWAY_WRITE_TIMEOUT": str(timeout)}
    if timeout >= 1:  # a write's wait must end before Redis's own timeout does
        env["JETWAY_REDIS_TIMEOUT"] = str(timeout + 5)
    return JetwayServer(pair.url, tmp_path / f"jetway-{replicas}.log", env=env)


@pytest.fixture
def one_replica(pair, tmp_path) -> Iterator[JetwayServer]:
    server = gateway(pair, tmp_path, 1)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


class Stopped:
    """The replica frozen for the ``with`` block: it receives nothing and confirms nothing."""

    def __init__(self, pair: ReplicatedPair) -> None:
        self.process = pair.replica.process

    def __enter__(self) -> Stopped:
        self.process.send_signal(signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGCONT)


def stored(pair: ReplicatedPair, node: str, doc_id: str, field: str = "b"):
    server = pair.master if node == "master" else pair.replica
    with server.client() as client:
        return client.hget(document_key(b"wc", doc_id.encode()), field)


def put(server: JetwayServer, doc_id: str, body: bytes = b'{"n":1}', **headers: str) -> requests.Response:
    return requests.put(server.url(f"/v1/wc/{doc_id}"), data=body, headers={**JSON, **headers}, timeout=10)


def assert_not_replicated(response: requests.Response, took: float) -> dict:
    assert response.status_code == 503, response.content
    problem = response.json()
    assert problem["type"] == PROBLEM + "not-replicated"
    assert "applied on the primary" in problem["detail"] and "0 of 1 replicas" in problem["detail"]
    assert response.headers["Retry-After"]
    assert WRITE_TIMEOUT * 0.9 <= took < WRITE_TIMEOUT + 1.0, took
    return problem


def test_every_write_is_on_the_replica_when_it_is_answered(pair, one_replica):
    # Asked straight after each answer: WAIT is what put it there in time.
    for n in range(20):
        assert put(one_replica, f"d{n}", b'{"n":%d}' % n).status_code == 201
        assert stored(pair, "replica", f"d{n}") == b'{"n":%d}' % n
    patched = requests.patch(
        one_replica.url("/v1/wc/d0"), data=b'{"m":2}', headers={"Content-Type": "application/merge-patch+json"}
    )
    assert patched.status_code == 200
    assert json.loads(stored(pair, "replica", "d0")) == {"n": 0, "m": 2}
    created = requests.post(one_replica.url("/v1/wc"), data=b'{"c":1}', headers=JSON, timeout=10)
    assert created.status_code == 201
    assert stored(pair, "replica", created.headers["Location"].rsplit("/", 1)[1]) == b'{"c":1}'
    assert requests.delete(one_replica.url("/v1/wc/d1"), timeout=10).status_code == 204
    assert stored(pair, "replica", "d1") is None


def test_a_lagging_replica_makes_writes_not_replicated_within_the_timeout(pair, one_replica):
    assert put(one_replica, "lag").status_code == 201
    with Stopped(pair):
        started = time.monotonic()
        response = put(one_replica, "lag", b'{"n":2}')
        problem = assert_not_replicated(response, time.monotonic() - started)
        # Applied on the primary, and the ETag is the one stored there: retry with If-Match is safe.
        assert stored(pair, "master", "lag") == b'{"n":2}'
        assert response.headers["ETag"].encode() == stored(pair, "master", "lag", "e")
        assert response.headers["ETag"] in problem["detail"]

        started = time.monotonic()
        created = requests.post(one_replica.url("/v1/wc"), data=b'{"c":2}', headers=JSON, timeout=10)
        assert_not_replicated(created, time.monotonic() - started)
        assert stored(pair, "master", created.headers["Location"].rsplit("/", 1)[1]) == b'{"c":2}'

        started = time.monotonic()
        deleted = requests.delete(one_replica.url("/v1/wc/lag"), timeout=10)
        assert_not_replicated(deleted, time.monotonic() - started)
        assert "ETag" not in deleted.headers and stored(pair, "master", "lag") is None

        # A write that did not happen is answered as such, whatever the replicas.
        assert put(one_replica, "lag2", **{"If-Match": '"nope"'}).status_code == 412
        assert requests.delete(one_replica.url("/v1/wc/absent"), timeout=10).status_code == 404


def test_reads_never_queue_behind_a_waiting_write(pair, tmp_path):
    # The writes wait as long as the replica is frozen (a timeout far longer than the reads, however loaded the
    # machine): reads answered while every write still waits did not queue behind them.
    server = gateway(pair, tmp_path, 1, timeout=20).start(["--workers", "1"])
    try:
        assert put(server, "r").status_code == 201
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            with Stopped(pair):
                writes = [pool.submit(put, server, f"w{n}") for n in range(4)]
                time.sleep(0.05)
                with requests.Session() as reads:  # keep-alive: a busy machine's connection set-ups are no wait
                    for _ in range(10):
                        assert reads.get(server.url("/v1/wc/r"), timeout=10).status_code == 200
                assert all(not write.done() for write in writes), "the writes should still be waiting"
            # The replica back: each write is confirmed.
            assert [write.result().status_code for write in writes] == [201] * 4
    finally:
        server.stop()


def test_more_replicas_than_there_are_is_never_confirmed(pair, tmp_path):
    server = gateway(pair, tmp_path, 2).start(["--workers", "1"])
    try:
        started = time.monotonic()
        response = put(server, "two")
        assert response.status_code == 503 and response.json()["type"] == PROBLEM + "not-replicated"
        assert "1 of 2 replicas" in response.json()["detail"]
        assert time.monotonic() - started >= WRITE_TIMEOUT * 0.9
    finally:
        server.stop()


def test_without_a_write_concern_a_lagging_replica_changes_nothing(pair, tmp_path):
    server = gateway(pair, tmp_path, 0).start(["--workers", "1"])
    try:
        with Stopped(pair):
            started = time.monotonic()
            assert put(server, "fast").status_code == 201
            assert time.monotonic() - started < WRITE_TIMEOUT
    finally:
        server.stop()
