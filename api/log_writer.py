"""A worker's log output: whole lines to a file descriptor, without ever blocking the worker.

Lines are collected as they are made and written together, once per turn
of the reactor (``flush``), with ``os.write`` on the descriptor: no text
layer, no buffered writer, no flush call on top.

Two ways to write, depending on whose descriptor it is:

- ``own`` (the master's pipe for this worker alone, ``--log-pipe``): the
  descriptor is made non-blocking, which is safe because no other process
  shares its open file description. What the pipe does not take waits here
  and goes out when the reactor says the pipe is writable again; a full
  pipe never holds the worker up. A write may end mid-line: only this
  worker writes to the pipe, and the master passes on whole lines only.
- shared (a file or pipe inherited with other processes, the worker run on
  its own): ``O_NONBLOCK`` belongs to the open file description, so setting
  it would change every other writer's descriptor too. Writes block, as any
  program's stdout does; to a pipe each write is at most ``PIPE_BUF`` bytes
  of whole lines, which the kernel keeps whole (a larger write to a pipe may
  be interleaved with another process's), and a file takes each write whole.

Bounded: at most ``limit`` bytes of lines wait here. A line that would go
over it is dropped and counted (``dropped``), the last resort when the
reader has stopped reading; a write that fails (the pipe closed, the disk
full) drops the lines it carried and counts them. The worker serves on.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import stat
from typing import Any, Callable, List

# Bytes of lines a worker keeps waiting before it drops new ones: about
# 4,000 access lines, a quarter second of a busy worker's log.
DEFAULT_LIMIT = 1 << 20
# The pipe's own buffer, asked for where the system allows (Linux's
# fs.pipe-max-size, 1 MiB by default, for an unprivileged process): the
# kernel holds a burst while the reader is busy, at no cost to the worker.
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031
# How long a stopping worker waits for a full pipe to take its last lines.
FINAL_WAIT_SECONDS = 2.0


class LineWriter:
    """Whole lines out to ``fd``, written once per reactor turn, in bounded memory."""

    def __init__(self, fd: int, own: bool, dropped: Callable[[int], None], limit: int = DEFAULT_LIMIT) -> None:
        self.fd = fd
        self.own = own
        self.limit = limit
        self._dropped = dropped
        self._lines: List[str] = []
        self._size = 0
        # In ``own`` mode: the part of an earlier write the pipe did not take.
        self._unsent = b""
        self._reactor: Any = None
        self._chunked = False
        if own:
            _set_nonblocking(fd)
            _grow_pipe(fd)
        else:
            self._chunked = not stat.S_ISREG(os.fstat(fd).st_mode)

    def add(self, line: str) -> None:
        """Queue one line (ending in a newline) for the next ``flush``."""
        size = self._size + len(line)
        if size + len(self._unsent) > self.limit:
            self._dropped(1)
            return
        self._lines.append(line)
        self._size = size

    def flush(self) -> None:
        """Write what is queued, as far as the descriptor takes it now."""
        if not self._lines:
            return
        data = "".join(self._lines).encode("utf-8", "replace")
        self._lines = []
        self._size = 0
        if self.own:
            self._send(self._unsent + data if self._unsent else data)
        else:
            self._write_shared(data)

    def waiting(self) -> int:
        """Bytes of lines not yet taken by the descriptor."""
        return self._size + len(self._unsent)

    def watch_with(self, reactor: Any) -> None:
        """Let ``reactor`` say when a full pipe can take more (``own`` mode)."""
        self._reactor = reactor

    def close(self) -> None:
        """Write everything still waiting; a full pipe gets ``FINAL_WAIT_SECONDS`` to take it."""
        self.flush()
        if self._reactor is not None and self._unsent:
            self._reactor.removeWriter(self)
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        while self._unsent and poller.poll(FINAL_WAIT_SECONDS * 1000):
            self._send(self._unsent)
        if self._unsent:
            self._drop(self._unsent)

    def _send(self, data: bytes) -> None:
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            # The reader is gone (EPIPE) or the descriptor is: nothing will
            # ever take these lines.
            self._drop(data)
            sent = len(data)
        was_waiting = bool(self._unsent)
        self._unsent = data[sent:]
        if self._reactor is not None and was_waiting != bool(self._unsent):
            if self._unsent:
                self._reactor.addWriter(self)
            else:
                self._reactor.removeWriter(self)

    def _write_shared(self, data: bytes) -> None:
        while data:
            size = whole_lines_within(data, select.PIPE_BUF) if self._chunked else len(data)
            try:
                written = os.write(self.fd, data if size == len(data) else data[:size])
            except InterruptedError:
                continue
            except OSError:
                self._drop(data)
                return
            data = data[written:]

    def _drop(self, data: bytes) -> None:
        lines = data.count(b"\n")
        if lines:
            self._dropped(lines)

    # What the reactor needs to watch the pipe (IWriteDescriptor), own mode only.

    def fileno(self) -> int:
        return self.fd

    def doWrite(self) -> None:
        if self._unsent:
            self._send(self._unsent)

    def connectionLost(self, reason: Any) -> None:
        self._unsent = b""

    def logPrefix(self) -> str:
        return "LineWriter"


def whole_lines_within(data: bytes, size: int) -> int:
    """How much of ``data`` to write at once: whole lines up to ``size`` bytes, or one longer line."""
    if len(data) <= size:
        return len(data)
    end = data.rfind(b"\n", 0, size) + 1
    if end:
        return end
    return data.find(b"\n", size) + 1 or len(data)


def _set_nonblocking(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError as error:
        # Not a pipe, or over the user's pipe quota: the default size will do.
        if error.errno not in (errno.EBADF, errno.EINVAL, errno.EPERM):
            raise
