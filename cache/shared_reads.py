"""Socket reads into one buffer that every connection of the process shares.

Twisted reads with ``socket.recv(bufferSize)``, and on PyPy that allocates a
buffer of the whole ``bufferSize`` on every read, whatever the read brings:
a 200 B request cost an 8 KiB buffer, a turn's Redis replies 16-64 KiB.
Reading with ``recv_into`` one buffer and copying out only the bytes that
came allocates what arrived and no more (a socket pair on PyPy, 200 B per
read: a minor collection every 500 reads at 8 KiB, every 7,000 here).

One buffer is enough: the reactor runs one read at a time, and what the
protocol is handed is a copy, which the next read cannot change.

Reads stop at 64 KiB. PyPy allocates a larger object outside its nursery,
where it counts towards the next major collection: with every command on
one Redis connection (``cache.link``), a turn of 10 KB reads brings a few
hundred KiB, and reads that grew to 1 MiB cost one worker 87.1 -> 103.5 us
per read and a p99 of 13-21 -> 31-37 ms, against 94.3 and 95.3 us at
64 KiB (``CASE=get10k loadtest/ab_cpu.sh``, 3 pairs each).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from twisted.internet import main, tcp

# The most one read brings (what Twisted asks by default).
READ_SIZE = 64 * 1024

_buffer = memoryview(bytearray(READ_SIZE))


def read_into_shared_buffer(transport: tcp.Connection) -> Optional[Any]:
    """Twisted's ``tcp.Connection.doRead``, reading into the shared buffer."""
    try:
        count = transport.socket.recv_into(_buffer)
    except OSError as error:
        if error.args[0] == tcp.EWOULDBLOCK:
            return None
        return main.CONNECTION_LOST
    return transport._dataReceived(_buffer[:count].tobytes())


def share_reads(transport: Any) -> None:
    """Make a plain socket transport read through the shared buffer; leave any other as it is.

    Any other: a TLS wrapper (its socket's reads feed the TLS engine, not
    the protocol) or a test's in-memory transport.
    """
    if isinstance(transport, tcp.Connection) and not transport.TLS:
        transport.doRead = functools.partial(read_into_shared_buffer, transport)
