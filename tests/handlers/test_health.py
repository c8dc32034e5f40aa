"""``/readyz``: one PING per half second per worker at most, and 503 soon after Redis goes away."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List

import pytest
import requests
from twisted.internet import defer, task

from handlers.health import READY_FOR, ReadinessProbe
from tests.support import JetwayServer, RedisServer


class Pings:
    """A store whose PINGs the test answers by hand (the probe's only call)."""

    def __init__(self) -> None:
        self.sent: List[defer.Deferred] = []

    def ping(self) -> defer.Deferred:
        self.sent.append(defer.Deferred())
        return self.sent[-1]


def results(answers: List[defer.Deferred]) -> List[object]:
    seen: List[object] = []
    for answer in answers:
        answer.addCallback(seen.append)
    return seen


def test_checks_during_a_ping_share_it_and_a_success_is_kept_for_a_while():
    clock, pings = task.Clock(), Pings()
    probe = ReadinessProbe(pings, clock)  # type: ignore[arg-type]
    seen = results([probe.check() for _ in range(5)])
    assert len(pings.sent) == 1 and seen == []
    pings.sent[0].callback(b"PONG")
    assert seen == [True] * 5
    clock.advance(READY_FOR / 2)
    assert results([probe.check()]) == [True] and len(pings.sent) == 1
    clock.advance(READY_FOR)
    probe.check()
    assert len(pings.sent) == 2


def test_a_failed_or_late_ping_is_not_ready_and_is_not_kept():
    clock, pings = task.Clock(), Pings()
    probe = ReadinessProbe(pings, clock, timeout=0.5)  # type: ignore[arg-type]
    seen = results([probe.check()])
    clock.advance(0.5)  # no answer in time
    assert seen == [False]
    probe.check()
    assert len(pings.sent) == 2  # the next check asks again at once
    pings.sent[1].errback(ConnectionError("refused"))


@pytest.fixture
def own_jetway(own_redis, tmp_path) -> Iterator[JetwayServer]:
    # No hot cache: its tracking connections PING Redis on their own, to measure their lag (cache/hot/tracking.py);
    # what these tests count is the health checks' PINGs.
    server = JetwayServer(own_redis.url, tmp_path / "jetway.log", env={"JETWAY_HOT_CACHE_BYTES": "0"})
    try:
        yield server.start(["--workers", "2"])
    finally:
        server.stop()


def ping_calls(own_redis: RedisServer) -> int:
    client = own_redis.client()
    try:
        return int(client.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))
    finally:
        client.close()


def test_many_health_checkers_cost_redis_a_few_pings(own_redis, own_jetway):
    def ready(_: int) -> int:
        return requests.get(own_jetway.url("/readyz"), timeout=5).status_code

    ready(0)
    before = ping_calls(own_redis)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(ready, range(400)))
    elapsed = time.monotonic() - started
    pings = ping_calls(own_redis) - before
    print(f"\n400 /readyz over {elapsed:.1f} s on 2 workers: {pings} PINGs")
    assert statuses == [200] * 400
    assert pings <= 2 * 2 * (elapsed / READY_FOR + 1)


def test_readyz_turns_503_within_a_second_of_redis_going_away(own_redis, own_jetway):
    assert requests.get(own_jetway.url("/readyz"), timeout=5).status_code == 200
    own_redis.stop()
    stopped = time.monotonic()
    while requests.get(own_jetway.url("/readyz"), timeout=5).status_code == 200:
        assert time.monotonic() - stopped < 3.0, "still ready 3 s after Redis stopped"
        time.sleep(0.02)
    print(f"\n/readyz answered 503 {time.monotonic() - stopped:.2f} s after Redis stopped")


def test_a_ping_that_fails_at_once_is_not_ready():
    class Refusing:
        def ping(self) -> defer.Deferred:
            raise ConnectionError("the certificate does not verify")

    probe = ReadinessProbe(Refusing(), task.Clock())  # type: ignore[arg-type]
    assert results([probe.check(), probe.check()]) == [False, False]
