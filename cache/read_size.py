"""How much a Redis connection asks of its socket per read: about what its replies bring.

Twisted asks for 64 KiB per read. The replies to one reactor turn's commands
are usually a few KiB, and on PyPy each read allocates a buffer of the size
asked, which feeds the garbage collector: at 64 KiB, one worker under 64
connections ran 77-78 major collections per 10 s against 66-71 at 16 KiB
(PyPy's GC hooks, two interleaved pairs, authorization off; CPU per read
28.6-31.2 against 27.2-28.5 µs). With authorization on,
``loadtest/ab_cpu.sh`` put the CPU gain within the noise (median 35.2 ->
34.4 µs, 4 pairs). Reads start at 16 KiB; a read that fills its buffer
doubles the size, up to 64 KiB, and one that fills less than a quarter
halves it again.

Not beyond 64 KiB: PyPy allocates a larger buffer outside its nursery, where
it counts towards the next major collection. With every command on one
connection (``cache.link``), the replies to a turn of 10 KB reads are a few
hundred KiB, and reads that grew up to 1 MiB cost one worker 87.1 -> 103.5 µs
per read and a p99 of 13-21 -> 31-37 ms; capped at 64 KiB, the same reads
measured as before (94.3 against 95.3 µs, p99 13-18 against 14-16 ms;
``CASE=get10k loadtest/ab_cpu.sh``, 3 pairs each).
"""

from __future__ import annotations

from typing import Any

MIN_READ = 16 * 1024
MAX_READ = 64 * 1024


def next_read_size(size: int, received: int) -> int:
    """The read size after a read of ``size`` bytes brought ``received``."""
    if received >= size:
        return min(size * 2, MAX_READ)
    if received < size // 4:
        return max(size // 2, MIN_READ)
    return size


class AdaptiveReads:
    """Keeps one transport's read size (Twisted's ``bufferSize``) fitted to its reads."""

    def __init__(self, transport: Any) -> None:
        # Only a socket transport reads by bufferSize; on a TLS wrapper the
        # attribute would be set and never used, so it is left alone.
        self._transport = transport if "bufferSize" in dir(type(transport)) else None
        if self._transport is not None:
            self._transport.bufferSize = MIN_READ

    def received(self, count: int) -> None:
        if self._transport is not None:
            self._transport.bufferSize = next_read_size(self._transport.bufferSize, count)
