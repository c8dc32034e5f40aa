"""The master's side of the workers' logs: whole lines from each worker's pipe to the master's stdout.

Each worker writes its log to a pipe of its own that the master reads
(``api.master`` starts it with ``--log-pipe``). So a worker can write
without blocking (the pipe's open file description is its alone; the
master's stdout is shared with whoever started it, and ``O_NONBLOCK`` on it
would change it for them too), and lines cannot interleave: the master is
the one writer of its stdout, it passes on only whole lines, and to a pipe
it writes at most ``PIPE_BUF`` bytes at a time, which the kernel keeps whole
even against another process writing to it (a worker's stderr may).

The writes are made by a thread of their own, so that a stdout that takes
nothing (a reader that stopped reading, a full pipe) never stops the master
from supervising its workers, and the master goes on reading the workers'
pipes (which keeps them from filling). At most ``limit`` bytes wait for that
thread; past that, whole lines are dropped and counted, as is what a write
that fails (a closed pipe, a full disk) carried.
"""

from __future__ import annotations

import os
import stat
import threading
from select import PIPE_BUF
from typing import Callable, Dict, List, Set

from api.log_writer import whole_lines_within

# Bytes of lines the master holds for its stdout before dropping new ones.
DEFAULT_LIMIT = 4 << 20
# A line this long without its end is not a log line: dropped.
MAX_LINE = 1 << 20


class Relay:
    """Whole lines from many sources to one descriptor, written by a thread; bounded."""

    def __init__(self, fd: int, dropped: Callable[[int], None], limit: int = DEFAULT_LIMIT) -> None:
        self.fd = fd
        self.limit = limit
        self._dropped = dropped
        self._chunked = not stat.S_ISREG(os.fstat(fd).st_mode)
        self._fragments: Dict[object, bytes] = {}
        self._overlong: Set[object] = set()
        self._queue: List[bytes] = []
        self._queued = 0
        self._closing = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._write_forever, name="log-relay", daemon=True)
        self._thread.start()

    def feed(self, source: object, data: bytes) -> None:
        """Bytes read from ``source``'s pipe: its whole lines go on, a last partial one waits for its end."""
        if source in self._overlong:
            # The rest of a line too long to keep: skipped to its end.
            start = data.find(b"\n") + 1
            if not start:
                return
            self._overlong.discard(source)
            data = data[start:]
        fragment = self._fragments.pop(source, b"")
        if fragment:
            data = fragment + data
        end = data.rfind(b"\n") + 1
        if end < len(data):
            if len(data) - end > MAX_LINE:
                self._dropped(1)
                self._overlong.add(source)
            else:
                self._fragments[source] = data[end:]
        if end:
            self._put(data if end == len(data) else data[:end])

    def source_closed(self, source: object) -> None:
        """``source`` ended (a worker exited): a line it left unfinished is dropped, never passed on cut."""
        if self._fragments.pop(source, b""):
            self._dropped(1)
        self._overlong.discard(source)

    def add(self, line: str) -> None:
        """One of the master's own lines."""
        self._put(line.encode("utf-8", "replace"))

    def flush(self) -> None:
        """Nothing to do: the thread writes as soon as it can."""

    def close(self, timeout: float) -> None:
        """Let the thread write what waits, for at most ``timeout`` seconds."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout)

    def _put(self, chunk: bytes) -> None:
        with self._ready:
            if self._queued + len(chunk) > self.limit:
                self._dropped(chunk.count(b"\n"))
                return
            self._queue.append(chunk)
            self._queued += len(chunk)
            self._ready.notify()

    def _write_forever(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return
                chunks, self._queue, self._queued = self._queue, [], 0
            self._write(b"".join(chunks))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            chunk = view[: whole_lines_within(view, PIPE_BUF)] if self._chunked else view
            try:
                written = os.write(self.fd, chunk)
            except InterruptedError:
                continue
            except OSError:
                # A closed pipe or a full disk: these lines are lost; the
                # next ones are tried again (the disk may get space).
                self._dropped(bytes(view).count(b"\n"))
                return
            view = view[written:]
