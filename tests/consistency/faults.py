"""The faults, each a scenario, injected while the clients run.

A fault runs in its own thread beside the recorder: it waits until a
share of the history's operations is recorded, acts, and logs what it did
with monotonic times (the history's ``faults``). ``SCENARIOS`` says, per
scenario, how the stack is built and what the checker is told.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

from tests.consistency.stack import Stack
from tests.multinode import SERVICE


@dataclass(frozen=True)
class Scenario:
    name: str
    does: str
    topology: str = "single"
    relay: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    # Acknowledged writes may be lost (asynchronous replication): the checker is told, for the fault's window only.
    lossy: bool = False
    # What the checker must find: "linearizable"; "delta": linearizable within CONSISTENCY_DELTA_MS (the hot
    # cache's promise, JETWAY_HOT_CACHE_MAX_LAG_MS) though maybe not strictly; "delta-violation": not even that.
    expect: str = "linearizable"
    # How late invalidations arrive (slow-invalidations scenarios), in milliseconds.
    delay_ms: Tuple[float, float] = (2.0, 20.0)
    # The clients' mix of operations (tests/consistency/recorder.py, MIXES).
    mix: str = "default"
    # Documents, instead of CONSISTENCY_DOCS: the Δ scenarios spread their reads over 10, since each read moved
    # Δ back overlaps more of its document's operations, and Porcupine's search grows as 2^(reads pending at once):
    # a history of 4,000 read-heavy operations over 5 documents took 0.07 s at Δ 25 ms, 6 s at 35 ms, over 120 s at 50.
    docs: Optional[int] = None


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("none", "no fault: the baseline"),
        Scenario("kill-worker", "each worker in turn killed with SIGKILL (the master respawns it)"),
        Scenario("sighup", "the master reloaded with SIGHUP (workers replaced one at a time)"),
        Scenario("kill-redis", "Redis killed with SIGKILL and restarted on its append-only file (make run's settings)"),
        Scenario(
            "failover",
            "SENTINEL FAILOVER of the primary, no write concern",
            topology="sentinel",
            mix="read-heavy",
            lossy=True,
        ),
        Scenario(
            "failover-wc",
            "SENTINEL FAILOVER of the primary, JETWAY_WRITE_REPLICAS=1",
            topology="sentinel",
            mix="read-heavy",
            env={"JETWAY_WRITE_REPLICAS": "1"},
        ),
        Scenario(
            "slow-invalidations",
            "every worker's invalidation connection delayed 2-20 ms through a relay",
            relay="tracking",
            mix="read-heavy",
            docs=10,
            expect="delta",
        ),
        Scenario(
            "slow-redis",
            "every Redis connection of every worker delayed 2-20 ms (replies, invalidations, pongs alike)",
            relay="all",
            mix="read-heavy",
            docs=10,
            expect="delta",
        ),
        Scenario(
            "late-invalidations",
            "invalidations delayed 250-500 ms: past the hot cache's bound, so it must bypass the cache",
            relay="tracking",
            mix="read-heavy",
            docs=10,
            expect="delta",
            delay_ms=(250.0, 500.0),
        ),
        Scenario(
            "late-invalidations-unbounded",
            "invalidations delayed 250-500 ms with the bound set out of reach (JETWAY_HOT_CACHE_MAX_LAG_MS=600000):"
            " the checker must find stale reads past Δ",
            relay="tracking",
            mix="read-heavy",
            docs=10,
            env={"JETWAY_HOT_CACHE_MAX_LAG_MS": "600000"},
            expect="delta-violation",
            delay_ms=(250.0, 500.0),
        ),
    ]
}


class Fault(threading.Thread):
    """Runs ``scenario``'s fault against ``stack`` as ``progress()`` (0..1) passes its marks."""

    def __init__(self, scenario: Scenario, stack: Stack, progress: Callable[[], float], seed: int = 0) -> None:
        super().__init__(daemon=True)
        self.scenario = scenario
        self.stack = stack
        self.progress = progress
        self.rng = random.Random(seed)
        self.log: List[Dict[str, Any]] = []
        self.error: Optional[str] = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            getattr(self, "_" + self.scenario.name.replace("-", "_"))()
        except Exception as error:  # the run goes on; the report says the fault failed
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.done.set()

    def note(self, what: str, at: int, until: Optional[int] = None, **extra: Any) -> None:
        self.log.append({"what": what, "at": at, "until": until or time.monotonic_ns(), **extra})

    def wait_for(self, share: float) -> None:
        while self.progress() < share and not self.done.is_set():
            time.sleep(0.01)

    def _none(self) -> None:
        pass

    def _kill_worker(self) -> None:
        for share in (0.3, 0.65):
            self.wait_for(share)
            self._kill_one(self.stack.workers())

    def _kill_one(self, before: List[int]) -> None:
        victim = before[0]
        at = time.monotonic_ns()
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: len(self.stack.workers()) == len(before) and victim not in self.stack.workers(), 30)
        self.note("SIGKILL worker", at, pid=victim, workers_after=self.stack.workers())

    def _sighup(self) -> None:
        self.wait_for(0.3)
        before = set(self.stack.workers())
        at = time.monotonic_ns()
        os.kill(self.stack.master_pid(), signal.SIGHUP)
        _wait(lambda: not before & set(self.stack.workers()) and len(self.stack.workers()) == len(before), 60)
        self.note("SIGHUP master", at, workers_before=sorted(before), workers_after=self.stack.workers())

    def _kill_redis(self) -> None:
        self.wait_for(0.4)
        server = self.stack.redis
        assert server is not None
        at = time.monotonic_ns()
        server.kill()
        down = time.monotonic_ns()
        time.sleep(0.3)
        server.start()
        self.note("SIGKILL redis, restarted on its AOF", at, killed=down, restarted=time.monotonic_ns())

    def sentinel_failover(self) -> Tuple[Any, int, int, int]:
        """``SENTINEL FAILOVER``, waited for until the sentinels name the new master and the old one says it
        is a replica: the old master's address, and when it was sent, switched and demoted."""
        sentinels = self.stack.sentinel
        assert sentinels is not None
        self.wait_for(0.3)
        before = sentinels.master_address()
        at = time.monotonic_ns()
        with sentinels.sentinels[0].client() as client:
            client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        _wait(lambda: sentinels.master_address() != before, 30)
        switched = time.monotonic_ns()
        _wait(lambda: _role(before[1]) == "slave", 30)
        return before, at, switched, time.monotonic_ns()

    def _failover(self) -> None:
        sentinels = self.stack.sentinel
        assert sentinels is not None
        before, at, switched, demoted = self.sentinel_failover()
        # Over only once the demoted primary has its new master's data: until then it is a replica in name only
        # (its PSYNC is refused, its offset having run on after the promotion, if only by the sentinels' hellos, and
        # Redis holds a diskless full sync back by repl-diskless-sync-delay, 5 s), and the next history's failover
        # would promote it with none of that history's writes (issue #56: tests/consistency/failover_timeline.py).
        _wait(lambda: _replica_synced(before[1]), 60)
        self.note(
            "SENTINEL FAILOVER",
            at,
            switched=switched,
            demoted=demoted,
            resynced=time.monotonic_ns(),
            old=before,
            new=sentinels.master_address(),
        )

    _failover_wc = _failover

    def _slow_invalidations(self) -> None:
        relay = self.stack.relay
        assert relay is not None
        self.wait_for(0.15)
        at = time.monotonic_ns()
        delays = []
        while self.progress() < 0.85:
            relay.delay = self.rng.uniform(*self.scenario.delay_ms) / 1000
            delays.append(round(relay.delay * 1000, 1))
            time.sleep(0.2)
        relay.delay = 0.0
        self.note(
            f"{relay.mode} connections delayed",
            at,
            delays_ms=f"{min(delays, default=0)}-{max(delays, default=0)}",
            delayed_connections=relay.delayed_connections,
        )

    _late_invalidations = _late_invalidations_unbounded = _slow_redis = _slow_invalidations


def _role(port: int) -> str:
    with redis.Redis("127.0.0.1", port, socket_timeout=2) as client:
        return client.execute_command("ROLE")[0].decode()


def _replica_synced(port: int) -> bool:
    """A replica with its master's data: the link up, no sync in progress."""
    with redis.Redis("127.0.0.1", port, socket_timeout=2) as client:
        info = client.info("replication")
    return info["role"] == "slave" and info.get("master_link_status") == "up" and not info["master_sync_in_progress"]


def _wait(check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, redis.RedisError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"not within {seconds} s")
