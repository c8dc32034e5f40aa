"""The processes a load test starts: redis-server, Jetway, nginx.

Every process is started by ``Processes`` and stopped by its pid (SIGTERM,
then SIGKILL), newest first, when the ``with`` block ends, however it ends;
nothing is ever stopped by name. A process can be pinned to a set of CPUs;
its children (Jetway's workers, nginx's) inherit the pinning.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from loadtest._token import ROOT

PYPY = ROOT / ".venv" / "bin" / "python"
CPYTHON = ROOT / ".venv-cpython" / "bin" / "python"
# Debian puts nginx in /usr/sbin, which a non-root PATH may lack.
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so ``finally`` blocks stop what was started."""
    signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(number: int, _frame: object) -> None:
    raise SystemExit(128 + number)


class Processes:
    """Starts processes and stops every one of them, by pid, on exit."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: List[subprocess.Popen] = []
        self.named: Dict[str, subprocess.Popen] = {}

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        command: Sequence[str],
        env: Optional[Dict[str, str]] = None,
        cpus: Optional[Sequence[int]] = None,
        cwd: Path = ROOT,
    ) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            # taskset execs the command (same pid); PyPy has no os.sched_setaffinity for a preexec_fn.
            pinned = ["taskset", "-c", ",".join(str(cpu) for cpu in cpus)] if cpus else []
            process = subprocess.Popen(
                [*pinned, *command],
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        self.started.append(process)
        self.named[name] = process
        return process

    def check_alive(self, process: subprocess.Popen, name: str) -> None:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}; see {self.directory / (name + '.log')}")

    def stop(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT)
        if process in self.started:
            self.started.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.started)):
            self.stop(process)

    def worker_rss_mb(self, name: str) -> List[float]:
        """The resident memory of each worker of the Jetway master started as ``name``, in MB."""
        pid = self.named[name].pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        sizes = []
        for child in children:
            status = Path(f"/proc/{child}/status").read_text()
            kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            sizes.append(round(kib / 1024, 1))
        return sizes

    def redis(self, cpus: Optional[Sequence[int]] = None, replica: bool = False, name: str = "redis") -> str:
        """A private redis-server on a unix socket; returns its REDIS_URL.

        ``replica``: with a replica too, in sync before this returns (a
        replica dials its master over TCP, so the master listens on a port).
        ``name``: of its socket and log, for more than one.
        """
        path = self.directory / f"{name}.sock"
        port = free_port() if replica else 0
        command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", str(path)]
        command += ["--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        process = self.start(name, command, cpus=cpus)
        wait_until(lambda: _redis_says(process, path, b"PING", b"+PONG"), START_TIMEOUT, "redis-server")
        if replica:
            home = self.directory / "replica"
            home.mkdir(exist_ok=True)
            replica_path = home / "redis.sock"
            command = ["redis-server", "--port", "0", "--unixsocket", str(replica_path), "--save", ""]
            command += ["--appendonly", "no", "--dir", str(home), "--replicaof", "127.0.0.1", str(port)]
            copy = self.start("redis-replica", command, cpus=cpus)
            in_sync = b"master_link_status:up"
            wait_until(lambda: _redis_says(copy, replica_path, b"INFO replication", in_sync), START_TIMEOUT, "sync")
        return f"unix://{path}"

    def jetway(
        self,
        name: str,
        python: Path,
        redis_url: str,
        workers: int,
        cpus: Optional[Sequence[int]] = None,
        module: str = "api",
        settings: Sequence[Tuple[str, str]] = (),
        cwd: Path = ROOT,
    ) -> str:
        """``python -m MODULE serve`` on a free port; returns its base URL (``cwd``: the tree whose code it runs)."""
        if not python.exists():
            raise RuntimeError(f"{python} is missing (make setup / make setup-cpython)")
        port = free_port()
        command = [str(python), "-m", module, "serve", "--port", str(port), "--workers", str(workers)]
        env = {"REDIS_URL": redis_url, "JETWAY_ACCESS_LOG": "off", **dict(settings)}
        process = self.start(name, command, env=env, cpus=cpus, cwd=cwd)
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            self.check_alive(process, name)
            return http_ok(base + "/healthz")

        wait_until(healthy, START_TIMEOUT, f"{name} on port {port}")
        return base

    def nginx(self, root: Path, workers: int, cpus: Optional[Sequence[int]] = None) -> str:
        """nginx serving ``root`` as static files on a free port; returns its base URL.

        A PUT to a file answers 200 with the file, as a GET would: nginx's
        static module refuses PUT with 405, which ``error_page`` turns into
        the file's contents.
        """
        port = free_port()
        conf = self.directory / "nginx.conf"
        conf.write_text(_nginx_conf(self.directory, root, port, workers))
        error_log = self.directory / "nginx-error.log"
        command = [NGINX, "-p", str(self.directory), "-e", str(error_log), "-c", str(conf)]
        process = self.start("nginx", command, cpus=cpus)
        base = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            self.check_alive(process, "nginx")
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_until(serving, START_TIMEOUT, f"nginx on port {port}")
        return base


def _redis_says(process: subprocess.Popen, path: Path, command: bytes, expected: bytes) -> bool:
    """Whether the redis-server on unix socket ``path`` answers ``command`` with ``expected`` in its reply."""
    if process.poll() is not None:
        raise RuntimeError(f"redis-server exited with {process.returncode}")
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1)
        probe.connect(str(path))
        probe.sendall(command + b"\r\n")
        return expected in probe.recv(4096)


def _nginx_conf(directory: Path, root: Path, port: int, workers: int) -> str:
    temp = "\n".join(f"    {kind}_temp_path {directory / kind};" for kind in _nginx_temp_kinds())
    user = "user root;" if os.geteuid() == 0 else ""
    return f"""
{user}
daemon off;
master_process on;
worker_processes {workers};
pid {directory / "nginx.pid"};
error_log {directory / "nginx-error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type application/json;
    types {{ }}
    keepalive_requests 100000000;
    keepalive_timeout 75s;
{temp}
    server {{
        listen 127.0.0.1:{port} reuseport;
        root {root};
        location / {{ error_page 405 =200 $uri; }}
    }}
}}
"""


def _nginx_temp_kinds() -> List[str]:
    """The temp paths this nginx has (each would default to a system directory)."""
    built = subprocess.run([NGINX, "-V"], capture_output=True, text=True, check=False).stderr
    kinds = ["client_body"]
    kinds += [kind for kind in ("proxy", "fastcgi", "uwsgi", "scgi") if f"--without-http_{kind}_module" not in built]
    return kinds
