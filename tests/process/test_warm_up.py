"""A worker's warm-ups (``api.warm_up``, ``api.warm_up_scratch``): every request answered, nothing left of them.

Each worker serves its warm-up requests to a throwaway copy of its
application whose Redis is in the worker (``api.warm_up_redis``), then to
one on the real Redis in a scratch collection. Checked against a real
server and a real Redis: every stand-in warm-up request answered 200 and
its Redis asked nothing it does not answer (a path that starts asking
Redis something new shows here, not as a warm-up of an error); the
scratch collection's writes ran on the real Redis before the worker
served, and no key of them is left, a user's data unchanged; no access
line and no metric counts them; the worker keeps no socket of them; and
then it serves.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import requests

from api.warm_up import CLOSE_SECONDS, MAX_SECONDS
from tests.proc_sockets import sockets_held
from tests.support import JetwayServer, RedisServer, wait_until, worker_pids

WARM_UP = 1500
_REPORT = re.compile(r"warm-up: (\d+) requests in [0-9.]+ s \((.*?)\)(.*)")
# How a report may end: done, or stopped by either of the warm-up's time bounds (api.warm_up), or both.
_LATE = f"not done in {MAX_SECONDS:g} s"
_SLOW_CLOSE = f"its connections not closed in {CLOSE_SECONDS:g} s"
STOPPED = ("", f"; stopped: {_LATE}", f"; stopped: {_SLOW_CLOSE}", f"; stopped: {_LATE}; {_SLOW_CLOSE}")


def reports(log: Path) -> List[str]:
    return [json.loads(line)["message"] for line in log.read_text().splitlines() if '"warm-up: ' in line]


@pytest.fixture
def servers(own_redis: RedisServer, tmp_path: Path) -> Iterator[List[JetwayServer]]:
    """A server that warms up and one that does not, both with production's log and authorization."""
    started: List[JetwayServer] = []
    try:
        for warm_up in (WARM_UP, 0):
            server = JetwayServer(
                own_redis.url,
                tmp_path / f"jetway-{warm_up}.log",
                env={"JETWAY_WARM_UP": str(warm_up), "JETWAY_ACCESS_LOG": "on", "JETWAY_WORKERS": "2"},
                auth=True,
            )
            started.append(server)  # stopped below even if its start fails half-way
            server.start()
        yield started
    finally:
        for server in started:
            server.stop()


def test_each_worker_warms_up_alone_and_then_serves(servers: List[JetwayServer], own_redis: RedisServer) -> None:
    warm, cold = servers
    wait_until(lambda: len(reports(warm.log_path)) >= 2, 30, "both workers' warm-up reports")
    found = reports(warm.log_path)
    assert len(found) == 2, found  # one per worker
    for report in found:
        answered, statuses, rest = _REPORT.match(report).groups()  # type: ignore[union-attr]
        # Every request it made answered 200, and its Redis asked nothing it could not answer. How many
        # it made is the machine's: on a loaded one a bound may cut it short (STOPPED), and it serves.
        assert 0 < int(answered) <= WARM_UP and statuses == f"{answered} 200", report
        assert rest in STOPPED, report
    assert reports(cold.log_path) == []

    # The stand-in's documents never reached the real Redis, and the scratch collection's are gone
    # (what the warm-up on Redis does there: test_the_warm_up_on_redis_writes_for_real_and_leaves_nothing).
    redis = own_redis.client()
    assert [key for key in redis.keys("*") if b"warm-up" in key or b"warm.up" in key] == []
    # No socket of it is left: a warmed worker holds as many as one that was not (once a warm-up
    # cut short by its close bound has closed them: it serves meanwhile).
    for server in servers:
        assert len(worker_pids(server)) == 2
    wait_until(
        lambda: sorted(map(sockets_held, worker_pids(warm))) == sorted(map(sockets_held, worker_pids(cold))),
        30,
        "the warmed workers to hold the sockets the cold ones do",
    )

    # It serves, and its access log and metrics hold the clients' requests only.
    token = warm.make_token("client", "admin")
    headers = {"Authorization": f"Bearer {token}"}
    put = requests.put(warm.url("/v1/items/a"), json={"a": 1}, headers=headers, timeout=5)
    assert put.status_code == 201
    assert requests.get(warm.url("/v1/items/a"), headers=headers, timeout=5).json() == {"a": 1}
    wait_until(lambda: "/v1/items/a" in warm.log_path.read_text(), 30, "the access lines")
    time.sleep(1.5)  # every worker's metrics flushed (each flushes once a second)
    assert "/v1/warm-up/" not in warm.log_path.read_text()
    metrics = requests.get(warm.url("/metrics"), headers=headers, timeout=5).text
    requests_total = sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("jetway_requests_total{")
    )
    assert requests_total < 20  # the health checks of the start and this test's few, not 2 x 1,500


def test_no_warm_up_request_carries_a_body_over_the_limit() -> None:
    from api.warm_up import _LARGE, _SMALL, _requests

    assert len(_SMALL) < 1024 < len(_LARGE)
    everything = b"".join(_requests("jw_token", 1 << 20))
    small_only = b"".join(_requests("jw_token", 1024))
    assert b"/v1/warm-up/w2" in everything and b"/v1/warm-up/w1" in everything
    assert b"/v1/warm-up/w2" not in small_only and small_only.count(b"PUT /v1/warm-up/w1 ") == 3


def _snapshot(redis: Any) -> Dict[bytes, Any]:
    """Every key and what it holds, dumped (a stream's entries and ids included)."""
    return {key: redis.dump(key) for key in redis.scan_iter(count=1000)}


def test_the_warm_up_on_redis_writes_for_real_and_leaves_nothing(own_redis: RedisServer, tmp_path: Path) -> None:
    """Its scripts ran on the real Redis before the worker served; no key of its scratch collection or
    token is left, and a user's document and feed are as they were."""
    from api.warm_up_scratch import SCRATCH

    redis = own_redis.client()
    user = JetwayServer(own_redis.url, tmp_path / "user.log", env={"JETWAY_WORKERS": "1"})
    try:
        user.start()
        assert requests.put(user.url("/v1/users/u1"), json={"name": "Ada"}, timeout=5).status_code == 201
    finally:
        user.stop()
    before = _snapshot(redis)
    assert any(key.endswith(b":f") for key in before)  # the user's feed holds the write's event
    redis.config_resetstat()

    server = JetwayServer(
        own_redis.url, tmp_path / "warm.log", env={"JETWAY_WARM_UP": "400", "JETWAY_WORKERS": "1"}, auth=True
    )
    try:
        server.start()  # healthy: its one worker warmed up and serves
        stats = redis.info("commandstats")
        found = [
            json.loads(line)["message"] for line in server.log_path.read_text().splitlines() if "warm-up on" in line
        ]
    finally:
        server.stop()
    assert len(found) == 1, found
    statuses = {int(status) for status in re.findall(r"\d+ (\d{3})", found[0].split("(")[1])}
    # Only what its requests may meet (a 412 on purpose, a 404 when another connection deleted first).
    assert "; stopped" not in found[0] and statuses <= {200, 201, 204, 404, 412}, found[0]
    # No client had written: these script calls are the warm-up's, on the real Redis.
    assert stats["cmdstat_evalsha"]["calls"] >= 100, stats.get("cmdstat_evalsha")
    assert [key for key in redis.scan_iter(count=1000) if SCRATCH.encode() in key] == []
    assert _snapshot(redis) == before


def test_no_client_can_name_the_scratch_collection() -> None:
    from api.warm_up_scratch import SCRATCH
    from handlers.http.errors import ApiError
    from handlers.http.validation import admit_collection, collection_name

    with pytest.raises(ApiError):
        collection_name(SCRATCH)
    revoke = admit_collection(SCRATCH)
    assert collection_name(SCRATCH) == SCRATCH.encode()
    revoke()
    with pytest.raises(ApiError):
        collection_name(SCRATCH)


def _all_keys(client: Any) -> List[bytes]:
    """Every key, on each master of a cluster (a SCAN is one node's)."""
    if hasattr(client, "get_primaries"):
        return [key for node in client.get_primaries() for key in client.get_redis_connection(node).scan_iter()]
    return list(client.scan_iter(count=1000))


def test_the_warm_up_on_redis_works_on_the_suites_topology(redis_server: RedisServer, tmp_path: Path) -> None:
    """On one Redis, a 3-master cluster or a Sentinel group (JETWAY_TEST_TOPOLOGY): every request answered as its
    mix expects, and no key of the scratch collection left on any node."""
    from api.warm_up_scratch import SCRATCH

    server = JetwayServer(
        redis_server.url, tmp_path / "warm.log", env={"JETWAY_WARM_UP": "300", "JETWAY_WORKERS": "1"}, auth=True
    )
    try:
        server.start()
        found = [
            json.loads(line)["message"] for line in server.log_path.read_text().splitlines() if "up on Redis" in line
        ]
    finally:
        server.stop()
    assert len(found) == 1, found
    statuses = {int(status) for status in re.findall(r"\d+ (\d{3})", found[0].split("(")[1])}
    assert "; stopped" not in found[0] and statuses <= {200, 201, 204, 404, 412}, found[0]
    assert [key for key in _all_keys(redis_server.client()) if SCRATCH.encode() in key] == []
