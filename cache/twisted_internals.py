"""Every place Jetway reaches into Twisted's private members: what each one is, and why it is needed.

Twisted is used through its public interfaces everywhere else. What these
functions touch is not public; an upgrade of Twisted is checked against
this module alone, and ``tests/test_framework_privates.py`` pins each name
below to the installed Twisted's source (and finds none of them elsewhere).
It sits in ``cache`` because the Redis driver needs it too, and ``cache``
is the layer every other imports.

- ``abstract.FileDescriptor.dataBuffer``, ``.offset``, ``._tempDataLen``,
  ``._writeDisconnected``: a transport's queued output. A connection's send
  timeout and the feed's slow-reader check measure it (``unsent_bytes``);
  bytes sent straight to the socket must have nothing queued before them
  (``may_send_now``, ``send_at_once``: ``api.eager_send``'s responses, ``cache.redis.resp``'s commands).
- ``tcp.Connection._dataReceived``: what a transport does with the bytes it
  read. A read into the shared buffer (``api.shared_reads``) hands them on
  as Twisted's own ``doRead`` would (``hand_to_protocol``).
- ``doRead`` assigned on a transport: the Redis connections read into their
  reply buffer instead of a new bytes object per read
  (``take_over_reads``, ``cache.redis.resp``).
- ``tcp.Port._fromListeningDescriptor``: what ``reactor.adoptStreamPort``
  does, for a port class of ours, which adoptStreamPort takes no argument
  for (``adopted_port``, ``api.eager_send``).
- ``epollreactor.EPollReactor._poller``, ``._selectables``,
  ``._doReadOrWrite``: the workers' reactor polls and dispatches without
  Twisted's per-event log context (``poll``, ``selectables``,
  ``handle_event``, ``api.event_loop``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from twisted.internet import main, tcp

# The most one socket read brings: what Twisted's transports ask by default. The
# shared client buffer (api.shared_reads) and the Redis reply buffers read as much.
READ_SIZE = 64 * 1024

# The private names this module touches, by the class that has them (the test reads this).
TOUCHED: Dict[str, Tuple[str, ...]] = {
    "twisted.internet.abstract.FileDescriptor": ("dataBuffer", "offset", "_tempDataLen", "_writeDisconnected"),
    "twisted.internet.tcp.Connection": ("_dataReceived",),
    "twisted.internet.tcp.Port": ("_fromListeningDescriptor",),
    "twisted.internet.epollreactor.EPollReactor": ("_poller", "_selectables", "_doReadOrWrite"),
}


def unsent_bytes(transport: Any) -> int:
    """What the transport queued and has not handed to the kernel yet (0 for a transport without a queue)."""
    try:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    except AttributeError:
        return 0


def may_send_now(transport: Any) -> bool:
    """Open for writing, in plain text, and nothing queued that must go first."""
    writable = transport.connected and not transport._writeDisconnected and not transport.TLS
    return writable and not transport._tempDataLen and transport.offset == len(transport.dataBuffer)


def send_at_once(transport: Any, data: bytes) -> bytes:
    """What the kernel takes of ``data`` sent straight from the transport's socket, when nothing is queued
    before it; returns the rest, for the transport's own ``write`` to queue (and to report a lost peer)."""
    if not may_send_now(transport):
        return data
    try:
        sent = transport.socket.send(data)
    except OSError:
        # Would block, or the peer is gone: the queued path sends later or reports the loss as Twisted does.
        return data
    return data[sent:]


def hand_to_protocol(transport: Any, data: bytes) -> Optional[Any]:
    """Bytes read from the transport's socket, handed on as its ``doRead`` would; what ``doRead`` returns."""
    return transport._dataReceived(data)


def read_failed(error: OSError) -> Optional[Any]:
    """What a ``doRead`` returns when its read raised: nothing yet, or the connection lost (as Twisted's)."""
    return None if error.args[0] == tcp.EWOULDBLOCK else main.CONNECTION_LOST


def take_over_reads(transport: Any, read: Callable[[], Optional[Any]]) -> None:
    """The transport's reads done by ``read`` (a ``doRead``: None, or why the connection is lost)."""
    transport.doRead = read


def adopted_port(port_class: Any, reactor: Any, fd: int, family: Any, factory: Any) -> Any:
    """A listening port of ``port_class`` on an inherited descriptor, as ``reactor.adoptStreamPort`` makes one."""
    return port_class._fromListeningDescriptor(reactor, fd, family, factory)


def poll(reactor: Any, timeout: Optional[float]) -> List[Tuple[int, int]]:
    """One epoll wait: at most one event per descriptor watched, as Twisted asks."""
    return reactor._poller.poll(-1 if timeout is None else timeout, len(reactor._selectables))


def selectables(reactor: Any) -> Dict[int, Any]:
    """The reactor's descriptors and what handles each."""
    return reactor._selectables


def handle_event(reactor: Any, selectable: Any, fd: int, event: int) -> None:
    """Twisted's handling of one epoll event (a read, a write, a hang-up)."""
    reactor._doReadOrWrite(selectable, fd, event)
