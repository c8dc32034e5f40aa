"""Many connections: a per-worker cap, and 10,000 held open against 2 workers."""

from __future__ import annotations

import resource
import select
import socket
import time
from pathlib import Path
from typing import List

import pytest

from tests.proc_sockets import established_by_pid
from tests.process.test_front_door import Conn, request
from tests.support import JetwayServer, wait_every_worker_serving, wait_until, worker_pids

HELD = 10_000


def test_a_worker_stops_accepting_at_its_connection_cap(redis_server, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "cap.log", env={"JETWAY_MAX_CONNECTIONS": "20"})
    held: List[Conn] = []
    try:
        server.start(["--workers", "1"])
        held = [Conn(server.port) for _ in range(19)]  # plus the one the start-up check may still hold
        for connection in held:
            connection.send(request("GET", "/healthz"))
            assert connection.response()[0] == 200
        time.sleep(0.2)
        extra = [Conn(server.port, timeout=1.0) for _ in range(2)]
        waiting = extra[-1]
        waiting.send(request("GET", "/healthz"))
        # Queued in the kernel, not accepted: no answer while the cap is reached.
        assert select.select([waiting.sock], [], [], 1.0)[0] == []
        for connection in held[:5]:
            connection.close()
        assert waiting.response()[0] == 200  # accepted once below the cap
        held.extend(extra)
    finally:
        for connection in held:
            connection.close()
        server.stop()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_10000_keep_alive_connections_against_2_workers(redis_server, redis_client, tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < HELD + 500:
        pytest.skip(f"the open-files hard limit is {hard}; holding {HELD} connections needs {HELD + 500}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = JetwayServer(redis_server.url, tmp_path / "10k.log")
    sockets: List[socket.socket] = []
    try:
        server.start(["--workers", "2"])
        wait_every_worker_serving(server, 2)  # else the first to serve is given all 10,000
        pids = worker_pids(server)
        rss_before = {pid: _rss_mb(pid) for pid in pids}
        for _ in range(HELD):
            sockets.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        wait_until(lambda: sum(established_by_pid(server.port).values()) >= HELD, 60, f"{HELD} accepted connections")
        held = established_by_pid(server.port)
        # Serve requests on a sample of the held connections.
        for sock in sockets[:: HELD // 100]:
            sock.sendall(request("GET", "/healthz"))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 OK")
        rss = {pid: _rss_mb(pid) for pid in pids}
        report = ", ".join(
            f"worker {n}: {held[pid]} connections, RSS {rss_before[pid]:.0f} -> {rss[pid]:.0f} MB"
            for n, pid in enumerate(pids)
        )
        print(f"\n{HELD} idle keep-alive connections held: {report}")
        assert all(count > 0 for count in held.values()), held
    finally:
        for sock in sockets:
            sock.close()
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
