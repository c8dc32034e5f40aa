"""Processes the suite starts: real redis-server and real Jetway servers.

Every process is started with its pid kept and stopped by that pid, also
when a test fails; nothing is ever killed by name.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import redis
import requests

from cache import keys

# One copy of these, shared with the load tools (which never import the tests).
from loadtest._servers import free_port, wait_until
from tests.proc_sockets import established_by_pid

ROOT = Path(__file__).resolve().parent.parent


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it lingers; by pid, never by name."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


class RedisServer:
    """A private redis-server on a unix socket in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket_path = str(directory / "redis.sock")
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            self.socket_path,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
        ]
        with open(self.directory / "redis.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.client().ping(), 10, "redis-server to answer")
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket_path)


class JetwayServer:
    """``python -m api serve`` as a real process on a free port."""

    def __init__(
        self,
        redis_url: str,
        log_path: Path,
        env: Optional[Dict[str, str]] = None,
        python: str = sys.executable,
        auth: bool = False,
    ) -> None:
        """A server; ``auth=False`` (JETWAY_AUTH=off) where authorization is not what a test is about."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.python = python
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "JETWAY_ACCESS_LOG": "off",
            "JETWAY_AUTH": "on" if auth else "off",
            # Seconds of every start the suite's servers need not spend (tests/process/test_warm_up.py warms up).
            "JETWAY_WARM_UP": "0",
            **(env or {}),
        }
        self.process: Optional[subprocess.Popen] = None

    def make_token(self, name: str, *scopes: str, rate: str = "", expires: str = "") -> str:
        """A token made with the admin CLI, as a user would."""
        return make_token(self.env["REDIS_URL"], name, *scopes, rate=rate, expires=expires)

    def start(self, args: Optional[List[str]] = None, stdout: Optional[int] = None) -> JetwayServer:
        """Start and wait until healthy; output to ``log_path``, or stdout to the descriptor ``stdout``."""
        command = [self.python, "-m", "api", "serve", "--port", str(self.port), *(args or [])]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=self.env,
                stdout=log if stdout is None else stdout,
                stderr=log if stdout is not None else subprocess.STDOUT,
            )
        wait_until(self._healthy, 30, f"jetway on port {self.port} (log: {self.log_path})")
        return self

    def _healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"jetway exited with {self.process.returncode}; see {self.log_path}")
        return requests.get(self.base + "/healthz", timeout=1).status_code == 200

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def url(self, path: str) -> str:
        return self.base + path


def worker_pids(server: JetwayServer) -> List[int]:
    """The master's workers, from ``/proc`` (a clean Debian has no ``ps``)."""
    pid = server.process.pid  # type: ignore[union-attr]
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return sorted(int(child) for child in children)


def every_worker_serves(server: JetwayServer) -> bool:
    """16 new connections answered, some by each worker (a worker still starting gets none: api.steering)."""
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(16)]
    try:
        for sock in connections:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(4096)
        return set(established_by_pid(server.port)) == set(worker_pids(server))
    finally:
        for sock in connections:
            sock.close()


def wait_every_worker_serving(server: JetwayServer, workers: int, timeout: float = 30) -> None:
    """Until ``workers`` workers run and each serves: the first one's /healthz says nothing of the others',
    and while one still warms up the master steers every new connection to those that serve."""
    wait_until(
        lambda: len(worker_pids(server)) == workers and every_worker_serves(server),
        timeout,
        f"all {workers} workers serving",
    )


def keys_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m api keys ...`` against ``redis_url``."""
    return subprocess.run(
        [sys.executable, "-m", "api", "keys", *args],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_token(redis_url: str, name: str, *scopes: str, rate: str = "", expires: str = "") -> str:
    args = ["create", "--name", name, *(arg for scope in scopes for arg in ("--scope", scope))]
    args += ["--rate", rate] if rate else []
    args += ["--expires", expires] if expires else []
    result = keys_cli(redis_url, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


class ClientThreads:
    """Client threads, each running ``run_client(number)`` until the ``with`` block ends.

    ``run_client`` loops until ``stopping`` is set; ``lock`` guards shared counts.
    """

    def __init__(self, threads: int) -> None:
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self._threads = [threading.Thread(target=self.run_client, args=(n,)) for n in range(threads)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(30)

    def run_client(self, number: int) -> None:
        raise NotImplementedError


# Requests of one client thread between two collections (see ``SteadyClient.run_client``).
COLLECT_EVERY = 100


class SteadyClient(ClientThreads):
    """GETs in a loop on fresh connections from 4 threads; records what failed and when."""

    def __init__(self, base: str, threads: int = 4) -> None:
        super().__init__(threads)
        self.url = base + "/v1/things/a"
        self.ok = 0
        self.failures: List[Tuple[float, str]] = []

    def __enter__(self) -> SteadyClient:
        super().__enter__()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.3)
        super().__exit__(*exc)

    def run_client(self, number: int) -> None:
        sent = 0
        while not self.stopping.is_set():
            sent += 1
            if sent % COLLECT_EVERY == 0:
                # On PyPy a socket dropped without close() keeps its descriptor
                # until a collection finds it (requests leaves some to CPython's
                # reference counting): across a group restart these clients held
                # ~2,700 sockets in one local run and hit the fd limit in a CI run.
                # One thread at a time: PyPy refuses a collection while another runs.
                with self.lock:
                    gc.collect()
            try:
                response = requests.get(self.url, timeout=10)
                outcome = None if response.status_code in (200, 404) else f"status {response.status_code}"
            except requests.RequestException as error:
                outcome = type(error).__name__ + ": " + str(error)
            with self.lock:
                if outcome is None:
                    self.ok += 1
                else:
                    self.failures.append((time.monotonic(), outcome))
            if outcome is not None:
                time.sleep(0.01)  # count a refused port by time, not by how fast it refuses

    def report(self, what: str) -> str:
        window = self.failures[-1][0] - self.failures[0][0] if self.failures else 0.0
        kinds: Dict[str, int] = {}
        for _, outcome in self.failures:
            kind = failure_kind(outcome)
            kinds[kind] = kinds.get(kind, 0) + 1
        line = f"{what}: {self.ok} answered, {len(self.failures)} failed over {window:.2f}s {kinds}"
        print("\n" + line)
        return line


def failure_kind(outcome: str) -> str:
    """refused, reset, or the outcome itself."""
    if outcome.startswith("ConnectionError"):
        if "Connection refused" in outcome:
            return "refused"
        if "Connection reset" in outcome or "Connection aborted" in outcome:
            return "reset"
    return outcome


def settled(read: Callable[[], int], seconds: float = 10.0) -> int:
    """``read()`` once it stopped changing for 0.3 s (a worker finishing what it had taken on)."""
    last, deadline = read(), time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.3)
        now = read()
        if now == last:
            return now
        last = now
    raise AssertionError("never settled")


def feed_events(client: redis.Redis, collection: str) -> int:
    """The collection's change-feed events, over every shard's stream: one per write."""
    name = collection.encode()
    return sum(client.xlen(keys.feed_key(name, shard)) for shard in range(keys.INDEX_SHARDS))
