"""An incremental decoder for ``Transfer-Encoding: chunked`` request bodies."""

from __future__ import annotations

import re
from typing import List, Optional

from api.request_head import MAX_HEADER_LINES, ProtocolError

_MAX_LINE = 4096
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(;[^\r\n]*)?\Z")


class ChunkedDecoder:
    """Consumes a chunked body from a buffer as it arrives.

    ``feed`` takes what it can from the front of the buffer and returns True
    once the last chunk and its trailers have been read; ``body`` is then the
    decoded bytes. More than ``max_size`` decoded bytes is a 413.
    """

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._parts: List[bytes] = []
        self._size = 0
        self._remaining = 0
        self._state = "size"
        self._trailers = 0

    @property
    def announced(self) -> int:
        """The sum of the chunk sizes read so far: what the body will be at least."""
        return self._size

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)

    def take(self) -> bytes:
        """The bytes decoded since the last ``take`` (a streamed body's, which is not kept whole)."""
        data = b"".join(self._parts)
        self._parts = []
        return data

    def feed(self, buffer: bytearray) -> bool:
        while True:
            if self._state == "data":
                taken = bytes(buffer[: self._remaining])
                del buffer[: len(taken)]
                self._parts.append(taken)
                self._remaining -= len(taken)
                if self._remaining:
                    return False
                self._state = "data-end"
                continue
            if self._state == "data-end":
                if len(buffer) < 2:
                    return False
                if buffer[:2] != b"\r\n":
                    raise ProtocolError(400, "a chunk is longer than its size says")
                del buffer[:2]
                self._state = "size"
                continue
            line = _take_line(buffer)
            if line is None:
                return False
            if self._state == "size":
                self._start_chunk(line)
            elif not line:
                return True
            else:
                self._trailers += 1
                if self._trailers > MAX_HEADER_LINES:
                    raise ProtocolError(431, "too many trailer lines")

    def _start_chunk(self, line: bytes) -> None:
        match = _CHUNK_SIZE.match(line)
        if not match:
            raise ProtocolError(400, "malformed chunk size")
        size = int(match.group(1), 16)
        if size == 0:
            self._state = "trailers"
            return
        self._size += size
        if self._size > self.max_size:
            raise ProtocolError(413, f"the body is larger than {self.max_size} bytes")
        self._remaining = size
        self._state = "data"


def _take_line(buffer: bytearray) -> Optional[bytes]:
    end = buffer.find(b"\r\n")
    if end < 0:
        if len(buffer) > _MAX_LINE:
            raise ProtocolError(400, "a chunk line is too long")
        return None
    line = bytes(buffer[:end])
    del buffer[: end + 2]
    return line
