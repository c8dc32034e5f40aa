"""A threaded TCP relay between Jetway and Redis that delays what Redis sends, by a delay settable while it runs.

``mode="tracking"`` delays only the connections that name themselves
``jetway-hot-cache`` (``cache/hot/tracking.py``: each worker's invalidation
subscription), so a write's reply reaches its client on time while the
other workers hear of it late: the hot cache's invalidation channel is
slow. ``mode="all"`` delays every connection (a slow network to Redis).
Bytes keep their order on each connection; only their delivery is late.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from typing import Deque, List, Tuple

from tests.support import free_port

TRACKING_NAME = b"jetway-hot-cache"


class DelayRelay:
    def __init__(self, target_port: int, mode: str = "tracking") -> None:
        assert mode in ("tracking", "all")
        self.port = free_port()
        self.target_port = target_port
        self.mode = mode
        self.delay = 0.0  # seconds; set it at any time
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.delayed_connections = 0

    def start(self) -> DelayRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        _close(self._listener)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            link = _Link(self, client, server)
            threading.Thread(target=link.upstream, daemon=True).start()
            threading.Thread(target=link.downstream, daemon=True).start()
            threading.Thread(target=link.deliver, daemon=True).start()


class _Link:
    """One relayed connection: client -> Redis at once, Redis -> client through a queue released on time."""

    def __init__(self, relay: DelayRelay, client: socket.socket, server: socket.socket) -> None:
        self.relay = relay
        self.client = client
        self.server = server
        self.delayed = relay.mode == "all"
        self.queue: Deque[Tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.closed = False
        self.seen = b""

    def upstream(self) -> None:
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    break
                if not self.delayed and len(self.seen) < 4096:
                    self.seen += data
                    if TRACKING_NAME in self.seen:
                        self.delayed = True
                        self.relay.delayed_connections += 1
                self.server.sendall(data)
        except OSError:
            pass
        self._close()

    def downstream(self) -> None:
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                due = time.monotonic() + (self.relay.delay if self.delayed else 0.0)
                with self.ready:
                    self.queue.append((due, data))
                    self.ready.notify()
        except OSError:
            pass
        with self.ready:
            self.queue.append((0.0, b""))  # end of stream, after what is queued
            self.ready.notify()

    def deliver(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue:
                        self.ready.wait()
                    due, data = self.queue.popleft()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.client.sendall(data)
        except OSError:
            pass
        self._close()

    def _close(self) -> None:
        _close(self.client)
        _close(self.server)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
