"""A draining worker (``api.drain``) never closes a connection on which a request may be on its way.

Against a real master with one worker: connections that had asked nothing
when the drain began, and a keep-alive connection whose next request came
while the worker was busy (so it sat unread in the kernel when the drain
looked at the connection), each get their answer, with ``Connection:
close``, and then the end of the connection.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Iterator, List

import pytest
import requests

from api.drain import IDLE_CLOSE
from tests.proc_sockets import established_by_pid
from tests.support import JetwayServer, wait_until, worker_pids

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
_LISTEN = "0A"


def answer(sock: socket.socket) -> bytes:
    """One response, read whole (a /healthz body ends the JSON object), or what came before the end."""
    data = b""
    while not data.endswith(b"}"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def ended(sock: socket.socket) -> bool:
    """The server closed its side (and sent nothing more)."""
    sock.settimeout(60)
    return sock.recv(4096) == b""


class SlowServer(JetwayServer):
    """A server whose every answer may take seconds (``JETWAY_DEBUG_BURN_US``)."""

    def _healthy(self) -> bool:
        return requests.get(self.base + "/healthz", timeout=30).status_code == 200


def serving(redis_server, tmp_path, **env: str) -> JetwayServer:
    server = SlowServer(redis_server.url, tmp_path / "master.log", env={"JETWAY_GRACE": "8", **env})
    server.start(["--workers", "1"])
    wait_until(lambda: len(worker_pids(server)) == 1, 10, "the worker")
    return server


@pytest.fixture
def server(redis_server, redis_client, tmp_path) -> Iterator[JetwayServer]:
    started = serving(redis_server, tmp_path)
    try:
        yield started
    finally:
        started.stop()


def listens(pid: int, port: int) -> bool:
    """``pid`` holds a socket listening on ``port`` (a draining worker lets go of its own at once)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(f"socket:[{fields[9]}]")
    return any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir())


def connected(server: JetwayServer, count: int) -> List[socket.socket]:
    """``count`` connections the worker has accepted."""
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(count)]
    worker = worker_pids(server)[0]
    wait_until(lambda: established_by_pid(server.port).get(worker, 0) >= count, 10, "the worker to accept them")
    return socks


def test_connections_that_asked_nothing_when_the_drain_began_are_answered_when_they_ask(server):
    """A client connects to ask: its first request is answered (Connection: close) however late in the grace."""
    socks = connected(server, 20)
    try:
        server.process.send_signal(signal.SIGTERM)
        time.sleep(IDLE_CLOSE + 0.5)  # longer than an answered keep-alive connection is kept idle
        for sock in socks:
            sock.sendall(HEALTHZ)
        for sock in socks:
            response = answer(sock)
            assert response.startswith(b"HTTP/1.1 200 "), response
            assert b"\r\nConnection: close\r\n" in response
            assert ended(sock)
    finally:
        for sock in socks:
            sock.close()
    assert server.process.wait(60) == 0


@pytest.mark.slow
def test_a_request_unread_when_the_drain_closes_idle_connections_is_answered(redis_server, redis_client, tmp_path):
    """The worker is busy (every request burns 2.5 s of CPU here) while a keep-alive client sends its next
    request: when the drain next looks, that connection is idle past IDLE_CLOSE, its request still unread."""
    # A grace that covers both burns on a loaded machine (the burn counts CPU time, not wall time).
    burn = str(int((IDLE_CLOSE + 0.5) * 1e6))
    server = serving(redis_server, tmp_path, JETWAY_DEBUG_BURN_US=burn, JETWAY_GRACE="60")
    socks: List[socket.socket] = []
    try:
        socks += connected(server, 1)
        kept = socks[0]
        kept.sendall(HEALTHZ)
        assert answer(kept).startswith(b"HTTP/1.1 200 ")  # keep-alive: idle from now on
        socks += connected(server, 1)
        busy = socks[1]
        worker = worker_pids(server)[0]
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: not listens(worker, server.port), 10, "the worker to begin its drain")
        busy.sendall(HEALTHZ)  # the worker burns as it answers: nothing else is read meanwhile
        time.sleep(0.5)
        kept.sendall(HEALTHZ)  # waits in the kernel until the burn ends
        for sock in (busy, kept):
            response = answer(sock)
            assert response.startswith(b"HTTP/1.1 200 "), response
            assert b"\r\nConnection: close\r\n" in response
            assert ended(sock)
        assert server.process.wait(60) == 0
    finally:
        for sock in socks:
            sock.close()
        server.stop()
