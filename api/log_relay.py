"""The master's side of the workers' logs: whole lines from each worker's pipe to the master's stdout.

Each worker writes its log to a pipe of its own that the master reads
(``api.master`` starts it with ``--log-pipe``). So a worker can write
without blocking (the pipe's open file description is its alone; the
master's stdout is shared with whoever started it, and ``O_NONBLOCK`` on it
would change it for them too), and lines cannot interleave: the master is
the one writer of its stdout, it passes on only whole lines, and to a pipe
it writes at most ``PIPE_BUF`` bytes at a time, which the kernel keeps whole
even against another process writing to it (a worker's stderr may).

When stdout is a regular file, the workers write to it themselves and
nothing is relayed (``api.master``): Linux writes each ``write`` to one
open file whole, whoever else writes to it, and a write to a file does not
wait for a reader. Relaying a worker's lines cost the master CPU on every
request, most of it in the kernel, reading the pipe and writing again.

A thread of its own does the reading and the writing, every
``READ_INTERVAL``: what the pipes took meanwhile (1 MiB each, see
``api.log_writer``) is read and written in a few large calls, and the
master's reactor never waits on its stdout. Waking for every write of every
worker (one per reactor turn) instead cost the master a wake-up and a small
read per worker turn, several times the thread's CPU per request
(docs/history/performance.md, "The changes, in the order done"). When stdout
takes nothing (a reader that stopped, a full pipe), the thread waits in
its write, the workers' pipes fill, and the workers drop and count lines
(``api.log_writer``): nothing else waits. Lines lost here are counted too:
those a failed write carried (a closed pipe, a full disk), a line a worker
left unfinished when it ended, a line longer than ``MAX_LINE``.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from select import PIPE_BUF
from typing import Callable, Dict, List, Set, Tuple

from api.log_writer import whole_lines_within

# How often the thread reads the workers' pipes, and how much per read.
READ_INTERVAL = 0.02
READ_SIZE = 1 << 16
# A line this long without its end is not a log line: dropped.
MAX_LINE = 1 << 20
# The master's own lines waiting for the thread (a few a minute, usually).
MAX_OWN_LINES = 10_000


class Relay:
    """Whole lines from the workers' pipes (and the master's own) to ``fd``, by a thread."""

    def __init__(self, fd: int, dropped: Callable[[int], None], interval: float = READ_INTERVAL) -> None:
        self.fd = fd
        self.interval = interval
        self._dropped = dropped
        # A regular file takes each write whole; a pipe only PIPE_BUF bytes.
        self.to_file = stat.S_ISREG(os.fstat(fd).st_mode)
        self._chunked = not self.to_file
        self._lock = threading.Lock()
        self._new_pipes: List[Tuple[object, int]] = []
        self._own: List[bytes] = []
        # Used by the thread alone:
        self._pipes: Dict[object, int] = {}
        self._fragments: Dict[object, bytes] = {}
        self._overlong: Set[object] = set()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._relay_until_closed, name="log-relay", daemon=True)
        self._thread.start()

    def watch(self, source: object, fd: int) -> None:
        """Relay the pipe ``fd`` (``source``'s log) from now on; it is closed once every writer has."""
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        with self._lock:
            self._new_pipes.append((source, fd))

    def add(self, line: str) -> None:
        """One of the master's own lines (``api.logs.Lines``)."""
        with self._lock:
            if len(self._own) >= MAX_OWN_LINES:
                self._dropped(1)
                return
            self._own.append(line.encode("utf-8", "replace"))

    def flush(self) -> None:
        """Nothing to do: the thread writes the master's lines at its next pass."""

    def close(self, timeout: float) -> None:
        """Relay what the pipes still hold (the workers have ended), for at most ``timeout`` seconds."""
        self._closing.set()
        self._thread.join(timeout)

    def _relay_until_closed(self) -> None:
        while not self._closing.wait(self.interval):
            self._relay()
        self._relay()  # what came since, up to each ended worker's last line

    def _relay(self) -> None:
        with self._lock:
            own, self._own = self._own, []
            self._pipes.update(self._new_pipes)
            self._new_pipes = []
        # The master's lines taken before the pipes are read, written after them: a line the master logs
        # because of what a worker did (it serves, it ended) comes after the lines the worker wrote before.
        for source, fd in list(self._pipes.items()):
            self._relay_pipe(source, fd)
        if own:
            self._write(b"".join(own))

    def _relay_pipe(self, source: object, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # every writer has closed it: the worker has exited
                del self._pipes[source]
                os.close(fd)
                self._source_ended(source)
                return
            self.feed(source, data)
            if len(data) < READ_SIZE:
                return

    def feed(self, source: object, data: bytes) -> None:
        """Bytes from ``source``'s pipe: its whole lines are written, a last partial one waits for its end."""
        if source in self._overlong:
            # The rest of a line too long to keep: skipped to its end.
            start = data.find(b"\n") + 1
            if not start:
                return
            self._overlong.discard(source)
            data = data[start:]
        fragment = self._fragments.pop(source, b"")
        if not fragment and data.endswith(b"\n"):
            self._write(data)  # the usual read: whole writes of whole lines
            return
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
            self._write(data[:end])

    def _source_ended(self, source: object) -> None:
        """A line the worker left unfinished is dropped, never passed on cut."""
        if self._fragments.pop(source, b""):
            self._dropped(1)
        self._overlong.discard(source)

    def _write(self, data: bytes) -> None:
        while data:
            size = whole_lines_within(data, PIPE_BUF) if self._chunked else len(data)
            try:
                written = os.write(self.fd, data if size == len(data) else data[:size])
            except InterruptedError:
                continue
            except OSError:
                # A closed pipe or a full disk: these lines are lost; the
                # next ones are tried again (the disk may get space).
                self._dropped(data.count(b"\n"))
                return
            data = data[written:]
