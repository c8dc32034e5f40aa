"""A TCP relay in front of a redis-server that holds back Redis's replies to one chosen command.

``hold_at(marker)``: the first chunk a client sends that holds ``marker``
(a token's key, say) goes to Redis as usual, but what Redis sends back on
that connection is kept until ``release()``, then delivered in order. The
client sees a slow reply, never a lost one: the race of a lookup whose
reply is on its way while something else happens (tests/cache/test_token_cache.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import List, Optional

from tests.support import free_port


class HeldReplies:
    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.port = free_port()
        self.holding = threading.Event()  # set once the marker was seen, until release()
        self._marker: Optional[bytes] = None
        self._held: List[bytes] = []
        self._held_for: Optional[socket.socket] = None
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> HeldReplies:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def hold_at(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(data) for data in self._held)

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, []
            client, self._held_for = self._held_for, None
            self._marker = None
            self.holding.clear()
            if client is not None:
                for data in held:
                    client.sendall(data)

    def stop(self) -> None:
        _close(self._listener)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.unix_path)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._outbound, args=(client, server), daemon=True).start()
            threading.Thread(target=self._inbound, args=(server, client), daemon=True).start()

    def _outbound(self, client: socket.socket, server: socket.socket) -> None:
        for data in _chunks(client):
            with self._lock:
                if self._marker is not None and self._marker in data and self._held_for is None:
                    self._held_for = client
                    self.holding.set()
            with contextlib.suppress(OSError):
                server.sendall(data)

    def _inbound(self, server: socket.socket, client: socket.socket) -> None:
        for data in _chunks(server):
            with self._lock:
                if self._held_for is client:
                    self._held.append(data)
                    continue
                with contextlib.suppress(OSError):
                    client.sendall(data)


def _chunks(source: socket.socket):
    while True:
        try:
            data = source.recv(65536)
        except OSError:
            return
        if not data:
            return
        yield data


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
