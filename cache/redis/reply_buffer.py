"""Redis's bytes, received straight into one buffer per connection and parsed there.

Every command of a worker goes down one Redis connection (``cache.redis.link``),
so under load a read brings several replies and usually ends inside one.
Handed each read as ``bytes``, the protocol copied a 10 KB value four
times: the read out of the socket buffer, that copy joined to the partial
reply the read before had left, the value sliced out of the join, and the
new partial reply kept for the next read. On PyPy every copy is nursery
the next minor collection must clear, and a join past ~64 KB is allocated
outside it, where it counts towards the next major collection. Here a read
goes into the free end of the connection's buffer (``recv_into``), replies
are parsed where they lie, each value is copied out once, and the partial
reply is moved to the front of the buffer in place.

The buffer is 64 KiB: what one read may bring. A reply larger than that
doubles it until the reply fits, and the buffer shrinks back once it is
empty again. Reads far larger than 64 KiB made PyPy slower (larger objects
are allocated outside its nursery and count towards the next major
collection): reads that grew to 1 MiB cost a worker more CPU per 10 KB read
and raised its p99, where reads of at most 64 KiB cost what the pool of
connections in turn did (``CASE=get10k loadtest/ab_cpu.sh``;
docs/history/performance.md, "The changes, in the order done").
"""

from __future__ import annotations

import socket

from cache.twisted_internals import READ_SIZE


class ReplyBuffer:
    """Bytes received and not yet parsed: ``data[:end]``."""

    def __init__(self, size: int = READ_SIZE) -> None:
        self._size = size
        self._use(bytearray(size))

    def receive(self, sock: socket.socket) -> int:
        """One ``recv_into`` the free end (the buffer doubles first if it is full); 0 at end of stream.

        Raises ``OSError`` as ``recv`` does.
        """
        if self.end == len(self.data):
            self._grow(2 * len(self.data))
        count = sock.recv_into(self._view[self.end :])
        self.end += count
        return count

    def append(self, data: bytes) -> None:
        """Add bytes received some other way (a TLS transport hands them over)."""
        needed = self.end + len(data)
        if needed > len(self.data):
            self._grow(max(needed, 2 * len(self.data)))
        self._view[self.end : needed] = data
        self.end = needed

    def consume(self, parsed: int) -> None:
        """Drop the first ``parsed`` bytes; what follows them moves to the front."""
        rest = self.end - parsed
        if rest and parsed:
            self._view[:rest] = self._view[parsed : self.end]
        self.end = rest
        if not rest and len(self.data) > self._size:
            self._use(bytearray(self._size))  # a large reply grew it: give the memory back

    def clear(self) -> None:
        self.consume(self.end)

    def _grow(self, size: int) -> None:
        bigger = bytearray(size)
        bigger[: self.end] = self._view[: self.end]
        self._use(bigger, self.end)

    def _use(self, data: bytearray, end: int = 0) -> None:
        self.data = data
        self._view = memoryview(data)
        self.end = end
