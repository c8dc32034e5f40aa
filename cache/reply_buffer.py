"""Redis's bytes, received straight into one buffer per connection and parsed there.

Every command of a worker goes down one Redis connection (``cache.link``),
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
collection): reads that grew to 1 MiB cost one worker 87.1 -> 103.5 us per
10 KB read and a p99 of 13-21 -> 31-37 ms, against 94.3 and 95.3 us at
64 KiB (``CASE=get10k loadtest/ab_cpu.sh``, 3 pairs each).
"""

from __future__ import annotations

import socket

from cffi import FFI

from cache.shared_reads import READ_SIZE

# A value is copied out of the buffer through a cffi view of it: on PyPy a
# memoryview's ``tobytes`` (and ``bytes()`` of a slice) copies twice, once
# into a temporary and once into the bytes, so a 10 KB value allocated 20 KB
# of nursery; this copies once (0.73 -> 0.29 us in a warm loop).
_ffi = FFI()


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

    def copy_out(self, start: int, size: int) -> bytes:
        """``data[start:start + size]`` as ``bytes``, copied once."""
        return _ffi.buffer(self._address + start, size)[:]

    def _use(self, data: bytearray, end: int = 0) -> None:
        # The buffer is never resized in place (it is replaced), so the
        # address cffi gives for it stays valid as long as it is in use.
        self.data = data
        self._view = memoryview(data)
        self._address = _ffi.from_buffer(data)
        self.end = end
