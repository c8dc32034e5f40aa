"""A TCP relay between a replica and its master that can hold the replication stream back.

Stopping a replica (SIGSTOP) does not lose anything: the master's stream
waits in the kernel's socket buffers and is applied when the replica runs
again, even after the master died. A lagging network does lose it. This
relay is that network: ``hold()`` keeps what the master sends from the
replica (the replica's acknowledgements still reach the master, so it looks
alive and merely behind), and ``cut()`` drops the connection, as a
partition would. What the master sent while held never arrives.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import List, Optional

from tests.support import free_port


class LagProxy:
    def __init__(self) -> None:
        self.port = free_port()
        self.target: Optional[int] = None  # the master's port, set before start()
        self._holding = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.held_bytes = 0

    def start(self) -> LagProxy:
        assert self.target is not None, "set target to the master's port first"
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def hold(self) -> None:
        """From now on, what the master sends is dropped on the way."""
        self._holding.set()

    def cut(self) -> None:
        """Close every relayed connection; held bytes are never delivered."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def stop(self) -> None:
        self._stopped.set()
        _close(self._listener)
        self.cut()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                replica, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                master = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                _close(replica)  # the master is gone: so is this attempt
                continue
            master.settimeout(None)
            with self._lock:
                self._sockets += [replica, master]
            threading.Thread(target=self._relay, args=(master, replica, True), daemon=True).start()
            threading.Thread(target=self._relay, args=(replica, master, False), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, from_master: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if from_master and self._holding.is_set():
                    self.held_bytes += len(data)
                    continue  # never delivered: a replica that fell behind and then lost its master
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    # shutdown first: close alone does not wake a thread blocked in recv on it.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
