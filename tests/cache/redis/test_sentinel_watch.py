"""cache.redis.sentinel_watch: what each announcement of the sentinels does to the connections made through it.

No Redis here: the announcements are handed to the watch as its subscriptions
would, on a clock the test drives. The watch under load, across a real
``SENTINEL FAILOVER``: tests/cache/redis/test_sentinel_switch.py.
"""

from __future__ import annotations

from typing import Any, List

from twisted.internet import defer
from twisted.internet.task import Clock

from cache.redis.address import parse_redis_url
from cache.redis.sentinel_watch import ABORTS, FENCE, FENCE_SECONDS, SUSPECT_SECONDS, SWITCH, SentinelWatch

URL = "redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster"
PROMOTING = b"slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379"
SWITCHED = b"mymaster 127.0.0.1 6379 127.0.0.1 6380"


class _Transport:
    def __init__(self) -> None:
        self.aborted = 0

    def abortConnection(self) -> None:
        self.aborted += 1


class _Connection:
    def __init__(self) -> None:
        self.transport = _Transport()


def watch_with(connections: int) -> tuple:
    clock = Clock()
    watch = SentinelWatch(parse_redis_url(URL), clock, 1.0, follow=False)
    made: List[Any] = [_Connection() for _ in range(connections)]
    for connection in made:
        assert watch.opened(connection, watch.generation)
    return watch, clock, made


def aborted(made: List[Any]) -> List[int]:
    return [connection.transport.aborted for connection in made]


def test_a_promotion_drops_every_connection_and_fences_until_the_switch_which_drops_them_again():
    watch, clock, made = watch_with(3)
    watch.announced(FENCE, PROMOTING)
    assert watch.fenced and aborted(made) == [1, 1, 1]
    late = _Connection()
    assert not watch.opened(late, watch.generation)  # made while fenced: maybe to the old master
    watch.announced(SWITCH, SWITCHED)
    assert not watch.fenced and aborted(made) == [2, 2, 2] and watch.switches == 1
    watch.announced(SWITCH, SWITCHED)  # the other sentinels announce it too: acted on once
    assert aborted(made) == [2, 2, 2] and watch.switches == 1


def test_a_connection_found_before_an_announcement_is_refused_when_it_is_made():
    watch, clock, made = watch_with(0)
    found_at = watch.generation
    watch.announced(SWITCH, SWITCHED)
    assert not watch.opened(_Connection(), found_at)
    assert watch.opened(_Connection(), watch.generation)


def test_announcements_about_another_master_change_nothing():
    watch, clock, made = watch_with(2)
    watch.announced(FENCE, PROMOTING.replace(b"@ mymaster", b"@ other"))
    watch.announced(SWITCH, SWITCHED.replace(b"mymaster", b"other"))
    assert not watch.fenced and aborted(made) == [0, 0] and watch.switches == 0


def test_an_abort_or_no_end_in_time_lifts_the_fence():
    watch, clock, made = watch_with(1)
    watch.announced(FENCE, PROMOTING)
    watch.announced(ABORTS[1], b"master mymaster 127.0.0.1 6379")
    assert not watch.fenced and aborted(made) == [2]
    watch.announced(FENCE, PROMOTING)
    clock.advance(FENCE_SECONDS - 0.1)
    assert watch.fenced
    clock.advance(0.2)
    assert not watch.fenced


def test_discovery_waits_while_fenced_and_asks_once_the_switch_is_announced():
    watch, clock, made = watch_with(0)
    asked: List[int] = []

    def ask(sentinel: Any) -> defer.Deferred:
        asked.append(watch.generation)
        return defer.succeed(("127.0.0.1", 6380))

    watch._ask = ask  # type: ignore[method-assign]
    watch._sentinel = object()  # type: ignore[assignment]  # no sentinel to dial or disconnect
    watch.announced(FENCE, PROMOTING)
    found = watch.master()
    assert not found.called and asked == []
    watch.announced(SWITCH, SWITCHED)
    assert found.called and asked == [watch.generation]
    assert found.result == (watch.generation, ("127.0.0.1", 6380))


def test_readonly_drops_the_connections_at_most_every_half_second():
    watch, clock, made = watch_with(1)
    watch.suspect()
    watch.suspect()
    assert aborted(made) == [1]
    clock.advance(SUSPECT_SECONDS)
    watch.suspect()
    assert aborted(made) == [2]


def test_a_failover_not_heard_of_is_found_by_asking_again_and_drops_the_connections():
    """No announcement came (no sentinel was subscribed yet, or none could be reached), but the
    sentinels' highest epoch names another master than the connections': they are dropped."""
    watch, clock, made = watch_with(2)
    answers = [("127.0.0.1", 6379)]
    watch._ask = lambda sentinel: defer.succeed(answers[0])  # type: ignore[method-assign]
    watch._sentinel = object()  # type: ignore[assignment]
    watch.master()
    assert watch.current == ("127.0.0.1", 6379)
    watch._recheck()
    assert aborted(made) == [0, 0]  # the same master: nothing to do
    answers[0] = ("127.0.0.1", 6380)
    watch._recheck()
    assert aborted(made) == [1, 1] and watch.current == ("127.0.0.1", 6380)


def test_after_a_switch_the_recheck_takes_the_announced_master_for_the_connections():
    watch, clock, made = watch_with(1)
    watch._ask = lambda sentinel: defer.succeed(("127.0.0.1", 6380))  # type: ignore[method-assign]
    watch._sentinel = object()  # type: ignore[assignment]
    watch.current = ("127.0.0.1", 6379)
    watch.announced(SWITCH, SWITCHED)
    assert aborted(made) == [1] and watch.current == ("127.0.0.1", 6380)
    watch._recheck()
    assert aborted(made) == [1]  # no second drop before any connection is made again
