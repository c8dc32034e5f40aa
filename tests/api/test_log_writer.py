"""api.log_writer: whole lines out, never blocking on a pipe of the worker's own, bounded, drops counted."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
from typing import List

from api.log_writer import LineWriter, whole_lines_within
from tests.support import stop_process


class Drops:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, lines: int) -> None:
        self.count += lines


class Watching:
    """The part of a reactor the writer uses: which descriptors it asked to watch for writing."""

    def __init__(self) -> None:
        self.writers: List[LineWriter] = []

    def addWriter(self, writer: LineWriter) -> None:
        self.writers.append(writer)

    def removeWriter(self, writer: LineWriter) -> None:
        self.writers.remove(writer)


def drain(fd: int) -> bytes:
    """Everything the pipe holds now."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return data


def line(n: int, size: int = 200) -> str:
    return f"line {n:06d} ".ljust(size - 1, "x") + "\n"


def test_lines_are_written_together_at_a_flush(pipe):
    read_end, write_end = pipe
    writer = LineWriter(write_end, True, Drops())
    writer.add(line(1))
    writer.add(line(2))
    assert drain(read_end) == b""
    writer.flush()
    assert drain(read_end) == (line(1) + line(2)).encode()


def test_a_full_pipe_of_its_own_never_blocks_and_what_it_does_not_take_waits(pipe):
    read_end, write_end = pipe
    drops, reactor = Drops(), Watching()
    writer = LineWriter(write_end, True, drops, limit=4 << 20)
    writer.watch_with(reactor)
    sent = [line(n) for n in range(20_000)]  # 4 MB: more than the pipe holds
    for text in sent:
        writer.add(text)
    writer.flush()  # returns: the pipe took what it could
    assert reactor.writers == [writer]  # the rest waits for the pipe to be writable
    received = b""
    while reactor.writers:
        received += drain(read_end)
        writer.doWrite()
    received += drain(read_end)
    assert received == "".join(sent).encode()
    assert drops.count == 0


def test_past_its_limit_new_lines_are_dropped_and_counted(pipe):
    read_end, write_end = pipe
    drops = Drops()
    writer = LineWriter(write_end, True, drops, limit=100_000)
    writer.watch_with(Watching())
    for n in range(30_000):  # 6 MB into a pipe nobody reads
        writer.add(line(n))
        if n % 100 == 99:
            writer.flush()
    assert drops.count > 0
    received = b""
    while writer.waiting():
        received += drain(read_end)
        writer.doWrite()
        writer.flush()
    received += drain(read_end)
    lines = received.decode().splitlines(keepends=True)
    # What was kept arrives whole and in order; what was dropped is counted.
    assert all(text == line(int(text.split()[1])) for text in lines)
    numbers = [int(text.split()[1]) for text in lines]
    assert numbers == sorted(numbers)
    assert len(lines) + drops.count == 30_000


def test_a_closed_pipe_drops_the_lines_and_the_writer_goes_on(pipe):
    read_end, write_end = pipe
    os.close(read_end)
    drops = Drops()
    writer = LineWriter(write_end, True, drops)
    writer.add(line(1))
    writer.add(line(2))
    writer.flush()  # EPIPE (Python ignores SIGPIPE)
    writer.add(line(3))
    writer.flush()
    assert drops.count == 3


def test_a_full_disk_drops_the_lines_and_the_writer_goes_on():
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        drops = Drops()
        writer = LineWriter(fd, False, drops)
        writer.add(line(1))
        writer.add(line(2))
        writer.flush()  # ENOSPC
        assert drops.count == 2
    finally:
        os.close(fd)


def test_a_shared_file_gets_every_line(tmp_path):
    path = tmp_path / "out.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        writer = LineWriter(fd, False, Drops())
        sent = [line(n) for n in range(1000)]
        for text in sent:
            writer.add(text)
        writer.flush()
    finally:
        os.close(fd)
    assert path.read_text() == "".join(sent)


def test_a_shared_pipe_is_written_whole_lines_at_a_time_within_pipe_buf():
    data = "".join(line(n, 300) for n in range(50)).encode()
    first = whole_lines_within(data, select.PIPE_BUF)
    assert first == 300 * (select.PIPE_BUF // 300)
    long_line = b"y" * 10_000 + b"\n" + b"z\n"
    assert whole_lines_within(long_line, select.PIPE_BUF) == 10_001  # one line longer than PIPE_BUF: alone
    assert whole_lines_within(b"short\n", select.PIPE_BUF) == 6


def test_close_waits_for_a_full_pipe_that_is_being_read(pipe, tmp_path):
    read_end, write_end = pipe
    drops = Drops()
    writer = LineWriter(write_end, True, drops, limit=8 << 20)
    sent = "".join(line(n) for n in range(10_000))  # 2 MB, more than the pipe holds
    writer.add(sent)
    writer.flush()
    with open(tmp_path / "read", "wb") as out:
        reader = subprocess.Popen(["cat"], stdin=read_end, stdout=out)
    try:
        writer.close()
        os.close(write_end)
        reader.wait(30)
    finally:
        stop_process(reader)
    assert (tmp_path / "read").read_text() == sent
    assert drops.count == 0
