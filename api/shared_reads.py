"""Socket reads into one buffer that every client connection of the process shares.

Twisted reads with ``socket.recv(bufferSize)``, and on PyPy that allocates a
buffer of the whole ``bufferSize`` on every read, whatever the read brings:
a 200 B request cost an 8 KiB buffer. Reading with ``recv_into`` one
buffer and copying out only the bytes that came allocates what arrived and
no more, so minor collections come far less often
(docs/history/performance.md, "The changes, in the order done").

One buffer is enough: the reactor runs one read at a time, and what the
protocol is handed is a copy, which the next read cannot change. Redis
connections read into a buffer of their own instead, where their replies
are parsed (``cache.redis.reply_buffer``).
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet import tcp

from cache.twisted_internals import READ_SIZE, hand_to_protocol, read_failed

_buffer = memoryview(bytearray(READ_SIZE))


def read_into_shared_buffer(transport: tcp.Connection) -> Optional[Any]:
    """Twisted's ``tcp.Connection.doRead``, reading into the shared buffer."""
    try:
        count = transport.socket.recv_into(_buffer)
    except OSError as error:
        return read_failed(error)
    return hand_to_protocol(transport, _buffer[:count].tobytes())
