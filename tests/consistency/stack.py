"""The system under test: Redis, an optional delaying relay, and the master with its workers.

Redis is one server with ``make run``'s append-only file, or a Sentinel
group (``tests/multinode.py``).

Everything is started here and stopped by pid in ``stop()``, also when a
run fails; nothing is killed by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

from tests.consistency.delay_relay import DelayRelay
from tests.multinode import RedisProcess, SentinelServers
from tests.support import JetwayServer, free_port, wait_until, worker_pids

WORKERS = 2


def aof_args(directory: Path, port: int) -> List[str]:
    """``make run``'s private Redis (Makefile, ``private-redis``): an append-only file fsynced every second."""
    return [
        *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)),
        *("--save", "", "--appendonly", "yes", "--appendfsync", "everysec"),
    ]


class TreeJetway(JetwayServer):
    """``python -m api serve`` from another checkout (``tree``): the same scenarios against another commit."""

    def __init__(self, tree: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tree = tree

    def start(self, args: Optional[List[str]] = None, stdout: Optional[int] = None) -> JetwayServer:
        command = [self.python, "-m", "api", "serve", "--port", str(self.port), *(args or [])]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, cwd=self.tree, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._healthy, 30, f"jetway on port {self.port} (log: {self.log_path})")
        return self


class Stack:
    """``topology``: ``single`` or ``sentinel``; ``relay``: None, ``tracking`` or ``all`` (``DelayRelay``).

    ``tree``: serve from that checkout rather than this one (``git archive COMMIT | tar -x -C DIR``).
    """

    def __init__(
        self,
        directory: Path,
        topology: str = "single",
        relay: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        tree: Optional[Path] = None,
    ) -> None:
        self.directory = directory
        self.tree = tree
        self.topology = topology
        self.relay_mode = relay
        self.env = env or {}
        self.redis: Optional[RedisProcess] = None
        self.sentinel: Optional[SentinelServers] = None
        self.relay: Optional[DelayRelay] = None
        self.jetway: Optional[JetwayServer] = None
        self.token = ""

    def start(self) -> Stack:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Kept before they start, so that stop() finds what a start that failed half-way left running.
        if self.topology == "sentinel":
            self.sentinel = SentinelServers(self.directory / "sentinel")
            self.sentinel.start()
            redis_url = self.sentinel.url
        else:
            port = free_port()
            home = self.directory / "redis"
            self.redis = RedisProcess(home, port, aof_args(home, port))
            self.redis.start()
            redis_url = f"redis://127.0.0.1:{port}/0"
        served_url = redis_url
        if self.relay_mode is not None:
            assert self.redis is not None, "the relay stands before a single Redis"
            self.relay = DelayRelay(self.redis.port, self.relay_mode).start()
            served_url = f"redis://127.0.0.1:{self.relay.port}/0"
        log = self.directory / "jetway.log"
        if self.tree is None:
            self.jetway = JetwayServer(served_url, log, env=self.env, auth=True)
        else:
            self.jetway = TreeJetway(self.tree, served_url, log, env=self.env, auth=True)
        self.jetway.start(["--workers", str(WORKERS)])
        self.token = self.jetway.make_token("consistency", "admin")
        wait_until(lambda: len(self.workers()) == WORKERS, 30, "the workers")
        return self

    def stop(self) -> None:
        for stop in (self._stop_jetway, self._stop_relay, self._stop_redis):
            with contextlib.suppress(Exception):
                stop()

    def _stop_jetway(self) -> None:
        if self.jetway is not None:
            workers = self.workers() if self.jetway.process and self.jetway.process.poll() is None else []
            self.jetway.stop()
            for pid in workers:  # a worker the master did not take down with it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _stop_relay(self) -> None:
        if self.relay is not None:
            self.relay.stop()

    def _stop_redis(self) -> None:
        if self.sentinel is not None:
            self.sentinel.stop()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> Stack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base(self) -> str:
        assert self.jetway is not None
        return self.jetway.base

    @property
    def port(self) -> int:
        assert self.jetway is not None
        return self.jetway.port

    def workers(self) -> List[int]:
        assert self.jetway is not None
        try:
            return worker_pids(self.jetway)
        except (FileNotFoundError, ProcessLookupError):
            return []

    def master_pid(self) -> int:
        assert self.jetway is not None and self.jetway.process is not None
        return self.jetway.process.pid
