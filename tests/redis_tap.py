"""A TCP relay in front of a redis-server that can stop a client's traffic at a chosen command.

``freeze_at(marker)``: the first chunk a client sends that holds ``marker``
(a script's SHA, say) is dropped, and that connection then carries nothing
more either way, as if its process had died at that instant. Tests use it
to stop a worker between two steps with certainty, then kill it for real.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import List, Optional

from tests.support import free_port


class RedisTap:
    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.port = free_port()
        self.frozen = threading.Event()
        self._marker: Optional[bytes] = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisTap:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def freeze_at(self, marker: bytes) -> None:
        self.frozen.clear()
        self._marker = marker

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
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self.unix_path)
            with self._lock:
                self._sockets += [client, server]
            gate = threading.Event()  # set: this connection is frozen
            threading.Thread(target=self._pump, args=(client, server, gate, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, gate, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, gate: threading.Event, outbound: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            marker = self._marker
            if outbound and marker is not None and marker in data and not self.frozen.is_set():
                gate.set()
                self.frozen.set()
            if gate.is_set():
                continue  # frozen: read and drop, so the sender never blocks
            try:
                target.sendall(data)
            except OSError:
                return


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
