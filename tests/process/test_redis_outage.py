"""Redis trouble maps to a status within the timeout, never to a hang."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import requests

from tests.support import JetwayServer, RedisServer, wait_until

TIMEOUT = 1.0
# Bounds a hang, not speed: a loaded 2-core machine may add a second of scheduling.
SLACK = 2.0


@pytest.fixture
def own_jetway(own_redis: RedisServer, tmp_path) -> Iterator[JetwayServer]:
    server = JetwayServer(own_redis.url, tmp_path / "jetway.log", env={"JETWAY_REDIS_TIMEOUT": str(TIMEOUT)})
    try:
        yield server.start()
    finally:
        server.stop()


def _put(server: JetwayServer, doc_id: str) -> requests.Response:
    return requests.put(
        server.url(f"/v1/things/{doc_id}"), data=b'{"a":1}', headers={"Content-Type": "application/json"}, timeout=10
    )


def _ready(server: JetwayServer) -> bool:
    return requests.get(server.url("/readyz"), timeout=10).status_code == 200


def test_redis_stopped_gives_503_within_the_timeout_then_recovers(own_redis, own_jetway):
    assert _put(own_jetway, "before").status_code == 201
    own_redis.stop()

    for path in ("/v1/things/before", "/v1/things", "/readyz"):
        started = time.monotonic()
        response = requests.get(own_jetway.url(path), timeout=10)
        elapsed = time.monotonic() - started
        assert response.status_code == 503, path
        assert response.headers["Content-Type"] == "application/problem+json"
        assert response.headers["Retry-After"] == "1"
        assert elapsed < TIMEOUT + SLACK, f"{path} took {elapsed:.2f}s"
    assert _put(own_jetway, "during").status_code == 503
    assert requests.get(own_jetway.url("/healthz"), timeout=10).status_code == 200

    own_redis.start()
    # No restart of Jetway: its pool reconnects by itself.
    wait_until(lambda: _put(own_jetway, "after").status_code == 201, 10, "writes to succeed again")
    assert requests.get(own_jetway.url("/readyz"), timeout=10).status_code == 200
    assert requests.get(own_jetway.url("/v1/things/after"), timeout=10).content == b'{"a":1}'


def test_redis_that_does_not_answer_gives_504(own_redis, own_jetway):
    """A Redis that holds the connection but never replies is a 504, not a hang."""
    assert _put(own_jetway, "x").status_code == 201
    # Every worker must hold a connection before the pause: one still
    # connecting then has none, which is a 503 (no connection), not this case.
    # 20 new connections reach both workers but with odds of 2 in a million.
    wait_until(lambda: all(_ready(own_jetway) for _ in range(20)), 10, "every worker connected to Redis")
    paused = own_redis.client()
    # CLIENT PAUSE stalls every other client's commands while this one waits.
    paused.execute_command("CLIENT", "PAUSE", int((TIMEOUT + 2) * 1000), "ALL")
    started = time.monotonic()
    response = requests.get(own_jetway.url("/v1/things/x"), timeout=10)
    assert response.status_code == 504
    assert time.monotonic() - started < TIMEOUT + SLACK
    paused.execute_command("CLIENT", "UNPAUSE")
    wait_until(lambda: requests.get(own_jetway.url("/v1/things/x"), timeout=10).status_code == 200, 10, "recovery")
