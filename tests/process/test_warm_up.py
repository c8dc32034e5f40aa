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

from api.warm_up import CLOSE_SECONDS
from tests.proc_sockets import sockets_held
from tests.support import JetwayServer, RedisServer, wait_until, worker_pids

WARM_UP = 1500
# A worker's start line (api.worker.log_serving) after a warm-up with no trouble: each part's count and time,
# its statuses left out (all as expected), and what a machine too busy to close in time adds.
_SLOW_CLOSE = f"(?:; its connections not closed in {CLOSE_SECONDS:g} s)?"
_SERVING = re.compile(
    rf"worker (\d) \(pid (\d+)\) serving on :\d+: warm-up (\d+) requests in [0-9.]+ s{_SLOW_CLOSE}"
    rf", on Redis (\d+) requests in [0-9.]+ s{_SLOW_CLOSE}"
)


def serving_lines(log: Path) -> List[Dict[str, Any]]:
    """The workers' start lines, one per worker start."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if ") serving on :" in line["message"]]


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


@pytest.mark.slow
def test_each_worker_warms_up_alone_and_then_serves(servers: List[JetwayServer], own_redis: RedisServer) -> None:
    warm, cold = servers
    wait_until(lambda: len(serving_lines(warm.log_path)) >= 2, 30, "both workers' start lines")
    found = serving_lines(warm.log_path)
    assert len(found) == 2, found  # one per worker
    assert sorted(line["slot"] for line in found) == [0, 1]
    assert sorted(line["pid"] for line in found) == sorted(worker_pids(warm))
    for line in found:
        # Info: every request it made answered as expected (200 on the stand-in), and its Redis asked nothing it
        # could not answer. How many it made is the machine's: on a loaded one a bound may cut it short.
        match = _SERVING.fullmatch(line["message"])
        assert line["level"] == "info" and match, line
        assert (int(match.group(1)), int(match.group(2))) == (line["slot"], line["pid"])
        assert 0 < int(match.group(3)) <= WARM_UP and 0 < int(match.group(4)) <= WARM_UP, line
    wait_until(lambda: len(serving_lines(cold.log_path)) >= 2, 30, "both cold workers' start lines")
    cold_lines = [line["message"].split(": ", 1)[1] for line in serving_lines(cold.log_path)]
    assert cold_lines == ["no warm-up (JETWAY_WARM_UP=0)"] * 2

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


def test_a_warm_up_report_names_its_statuses_only_when_in_trouble() -> None:
    """Its part of the start line: count and time; a status not expected, a command its Redis lacks or an error
    is trouble (the line a warning) and named; a time bound met or a slow close is not."""
    from api.warm_up import WarmUpReport

    fine = WarmUpReport({200: 1179}, 5.31, timed_out=True, notes=[f"its connections not closed in {CLOSE_SECONDS:g} s"])
    assert not fine.trouble
    assert fine.describe() == "warm-up 1179 requests in 5.3 s; its connections not closed in 2 s"
    scratch = WarmUpReport({200: 5, 201: 2, 412: 1}, 1.0, label="on Redis", expected=frozenset({200, 201, 412}))
    assert not scratch.trouble and scratch.describe() == "on Redis 8 requests in 1.0 s"
    failing = WarmUpReport({200: 10, 500: 2}, 1.0, unknown_commands=["XADD"])
    assert failing.trouble
    assert failing.describe() == (
        "warm-up 12 requests in 1.0 s (10 200, 2 500); its Redis was asked what it does not answer: XADD"
    )
    down = WarmUpReport({}, 0.2, error="could not warm up: Connection refused", label="on Redis")
    assert (
        down.trouble
        and down.describe()
        == "on Redis 0 requests in 0.2 s (none answered); stopped: could not warm up: Connection refused"
    )


def test_a_worker_whose_warm_up_cannot_reach_redis_serves_and_says_so_in_a_warning(tmp_path: Path) -> None:
    server = JetwayServer(
        f"unix://{tmp_path}/nobody.sock",
        tmp_path / "down.log",
        env={"JETWAY_WARM_UP": "100", "JETWAY_WORKERS": "1", "JETWAY_REDIS_TIMEOUT": "0.5"},
    )
    try:
        server.start()  # /healthz needs no Redis: it serves
        wait_until(lambda: serving_lines(server.log_path), 30, "the worker's start line")
        (line,) = serving_lines(server.log_path)
    finally:
        server.stop()
    assert line["level"] == "warn", line
    assert "warm-up 100 requests in " in line["message"] and "on Redis 0 requests in " in line["message"], line
    assert "stopped: could not warm up" in line["message"], line


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


@pytest.mark.slow
def test_the_warm_up_on_redis_writes_for_real_and_leaves_nothing(own_redis: RedisServer, tmp_path: Path) -> None:
    """Its scripts ran on the real Redis before the worker served; no key of its scratch collection or
    token is left, and a user's document and feed are as they were."""
    from api.warm_up_scratch import SCRATCH_PREFIX

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
        found = serving_lines(server.log_path)
    finally:
        server.stop()
    assert len(found) == 1, found
    # Info: only statuses its requests may meet (api.warm_up_scratch), and all 400 of them (none cut short).
    match = _SERVING.fullmatch(found[0]["message"])
    assert found[0]["level"] == "info" and match and match.group(4) == "400", found[0]
    # No client had written: these script calls are the warm-up's, on the real Redis.
    assert stats["cmdstat_evalsha"]["calls"] >= 100, stats.get("cmdstat_evalsha")
    assert [key for key in redis.scan_iter(count=1000) if SCRATCH_PREFIX.encode() in key] == []
    assert _snapshot(redis) == before


@pytest.mark.slow
def test_a_warm_up_whose_writes_pass_the_feed_cap_says_no_trouble(own_redis: RedisServer, tmp_path: Path) -> None:
    """Its feed reads are from the start, and its writes (most to one shard) pass a small cap: 410s, which are
    its own doing, not a warning (the CI run of stop 71: two workers sharing one scratch feed passed the default
    cap of 100,000 / 16 events a shard)."""
    server = JetwayServer(
        own_redis.url,
        tmp_path / "capped.log",
        env={"JETWAY_WARM_UP": str(WARM_UP), "JETWAY_WORKERS": "1", "JETWAY_FEED_MAX_EVENTS": "16"},
        auth=True,
    )
    try:
        server.start()
        found = serving_lines(server.log_path)
    finally:
        server.stop()
    assert len(found) == 1 and found[0]["level"] == "info", found
    assert _SERVING.fullmatch(found[0]["message"]), found


def test_no_client_can_name_the_scratch_collection() -> None:
    from api.warm_up_scratch import scratch_collection
    from handlers.http.errors import ApiError
    from handlers.http.validation import admit_collection, collection_name

    scratch = scratch_collection()
    with pytest.raises(ApiError):
        collection_name(scratch)
    revoke = admit_collection(scratch)
    assert collection_name(scratch) == scratch.encode()
    revoke()
    with pytest.raises(ApiError):
        collection_name(scratch)


def test_warm_ups_at_once_have_a_scratch_collection_each() -> None:
    """Workers warm up at once (on one host, or several sharing a Redis): one's removal of its collection
    deleted the feed the other was reading, a 410 in a CI run's start line (stop 71)."""
    from api.warm_up_scratch import SCRATCH_PREFIX, scratch_collection

    names = {scratch_collection() for _ in range(100)}
    assert len(names) == 100 and all(name.startswith(SCRATCH_PREFIX + ".") for name in names)


def _all_keys(client: Any) -> List[bytes]:
    """Every key, on each master of a cluster (a SCAN is one node's)."""
    if hasattr(client, "get_primaries"):
        return [key for node in client.get_primaries() for key in client.get_redis_connection(node).scan_iter()]
    return list(client.scan_iter(count=1000))


@pytest.mark.slow
def test_the_warm_up_on_redis_works_on_the_suites_topology(redis_server: RedisServer, tmp_path: Path) -> None:
    """On one Redis, a 3-master cluster or a Sentinel group (JETWAY_TEST_TOPOLOGY): every request answered as its
    mix expects, and no key of the scratch collection left on any node."""
    from api.warm_up_scratch import SCRATCH_PREFIX

    server = JetwayServer(
        redis_server.url, tmp_path / "warm.log", env={"JETWAY_WARM_UP": "300", "JETWAY_WORKERS": "1"}, auth=True
    )
    try:
        server.start()
        found = serving_lines(server.log_path)
    finally:
        server.stop()
    assert len(found) == 1, found
    match = _SERVING.fullmatch(found[0]["message"])
    assert found[0]["level"] == "info" and match and match.group(4) == "300", found[0]
    assert [key for key in _all_keys(redis_server.client()) if SCRATCH_PREFIX.encode() in key] == []
