"""``make run``'s private Redis keeps what it acknowledged: killed with SIGKILL, it comes back with it.

The Redis is started by the Makefile's own ``private-redis`` target (the one
``make run`` uses), in a temporary ``VAR``, and stopped by its pid file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import redis
import requests

from tests.support import ROOT, JetwayServer, wait_until


def start_private_redis(var: Path) -> None:
    result = subprocess.run(
        ["make", "--no-print-directory", "-s", "private-redis", f"VAR={var}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "append-only file" in result.stdout


def kill(var: Path, sig: int = signal.SIGKILL) -> None:
    pid = int((var / "redis.pid").read_text())
    os.kill(pid, sig)
    wait_until(lambda: not _alive(pid), 10, "the private Redis to die")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of nobody here: daemonized Redis is reparented, so gone means gone.
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_document_survives_sigkill_of_the_private_redis(tmp_path):
    var = tmp_path / "var"
    start_private_redis(var)
    server = None
    try:
        client = redis.Redis(unix_socket_path=str(var / "redis.sock"))
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        server = JetwayServer(f"unix://{var}/redis.sock", tmp_path / "jetway.log").start(["--workers", "1"])
        body = b'{"kept":true}'
        put = requests.put(server.url("/v1/aof/d1"), data=body, headers={"Content-Type": "application/json"})
        assert put.status_code == 201

        kill(var)  # at once: no shutdown, no snapshot
        start_private_redis(var)
        assert (var / "appendonlydir").is_dir()
        wait_until(lambda: requests.get(server.url("/v1/aof/d1")).status_code == 200, 10, "Jetway to reconnect")
        got = requests.get(server.url("/v1/aof/d1"))
        assert got.content == body and got.headers["ETag"] == put.headers["ETag"]
    finally:
        if server is not None:
            server.stop()
        if (var / "redis.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                kill(var, signal.SIGTERM)


def test_a_private_redis_from_before_gets_the_append_only_file_turned_on(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    sock = var / "redis.sock"
    subprocess.run(
        [
            *("redis-server", "--port", "0", "--unixsocket", str(sock), "--dir", str(var), "--appendonly", "no"),
            *("--daemonize", "yes", "--pidfile", str(var / "redis.pid"), "--logfile", str(var / "redis.log")),
        ],
        check=True,
        timeout=30,
    )
    try:
        wait_until(lambda: sock.exists() and redis.Redis(unix_socket_path=str(sock)).ping(), 10, "redis")
        start_private_redis(var)
        client = redis.Redis(unix_socket_path=str(sock))
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        # Its first append-only file is written by the time make returns, so it stops when told.
        assert client.info("persistence")["aof_rewrite_in_progress"] == 0
    finally:
        kill(var, signal.SIGTERM)
