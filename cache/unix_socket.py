"""Unix-socket connections to Redis that read with plain ``recv``.

Twisted's unix-socket transport reads with ``recvmsg`` on every read so that
it can receive file descriptors. Redis never sends any, and on PyPy that
path (a wrapper building a named tuple around ``socket.recvmsg``, with
ancillary buffer space) was ~7% of a worker's CPU on a document read over a
unix socket (vmprof, one worker). These transports read as TCP ones do.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp, unix


class _RecvClient(unix.Client):
    doRead = tcp.Connection.doRead


class _RecvConnector(unix.Connector):
    def _makeTransport(self) -> _RecvClient:
        return _RecvClient(self.address, self, self.reactor, self.checkPID)


class RecvUnixReactor:
    """Stands in for the reactor in a ``UNIXClientEndpoint``, whose only call is ``connectUNIX``."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def connectUNIX(self, address: str, factory: Any, timeout: float = 30, checkPID: int = 0) -> unix.Connector:
        connector = _RecvConnector(address, factory, timeout, self._reactor, checkPID)
        connector.connect()
        return connector
