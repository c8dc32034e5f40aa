"""api.log_relay: the workers' lines reach the master's stdout whole, and a stuck stdout stops nobody."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Tuple

import pytest
import requests

from api.log_relay import MAX_LINE, Relay
from tests.support import JetwayServer, stop_process, wait_until
from tests.test_master import worker_pids


class Drops:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, lines: int) -> None:
        with self.lock:  # counted from the relay's thread too
            self.count += lines


@pytest.fixture
def pipe() -> Iterator[Tuple[int, int]]:
    read_end, write_end = os.pipe()
    try:
        yield read_end, write_end
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):  # a test may have closed it
                os.close(fd)


def read_until(fd: int, size: int, timeout: float = 10.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < size and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            data += os.read(fd, 1 << 16)
    return data


def test_lines_fed_in_pieces_from_two_sources_come_out_whole(pipe):
    read_end, write_end = pipe
    relay = Relay(write_end, Drops())
    first = b"".join(b'{"source": 1, "n": %d}\n' % n for n in range(100))
    second = b"".join(b'{"source": 2, "n": %d}\n' % n for n in range(100))
    for start in range(0, len(first), 7):  # odd-sized pieces, alternating
        relay.feed("one", first[start : start + 7])
        relay.feed("two", second[start : start + 7])
    out = read_until(read_end, len(first) + len(second))
    relay.close(5)
    lines = out.splitlines(keepends=True)
    assert sorted(lines) == sorted(first.splitlines(keepends=True) + second.splitlines(keepends=True))
    assert [line for line in lines if b'"source": 1' in line] == first.splitlines(keepends=True)


def test_a_line_its_source_left_unfinished_is_dropped_not_passed_on_cut(pipe):
    read_end, write_end = pipe
    drops = Drops()
    relay = Relay(write_end, drops)
    relay.feed("worker", b"whole\nhal")
    relay.source_closed("worker")
    relay.add("next\n")
    assert read_until(read_end, 11) == b"whole\nnext\n"
    relay.close(5)
    assert drops.count == 1


def test_a_stdout_nobody_reads_stops_neither_feeding_nor_closing(pipe):
    read_end, write_end = pipe
    drops = Drops()
    relay = Relay(write_end, drops, limit=1 << 20)
    started = time.monotonic()
    for n in range(40_000):  # 8 MB: the pipe and the relay's limit are far smaller
        relay.feed("worker", b"%06d " % n + b"x" * 192 + b"\n")
    assert drops.count > 0
    relay.close(0.5)  # the thread is stuck in a write: close gives up after the timeout
    assert time.monotonic() - started < 30
    # Once read, what was kept is whole lines, in order.
    kept = read_until(read_end, 1 << 30, timeout=1).splitlines()
    assert kept and all(len(line) == 199 for line in kept)
    numbers = [int(line[:6]) for line in kept]
    assert numbers == sorted(numbers)


def test_a_closed_stdout_drops_and_counts_the_lines(pipe):
    read_end, write_end = pipe
    os.close(read_end)
    drops = Drops()
    relay = Relay(write_end, drops)
    relay.feed("worker", b"one\ntwo\n")
    relay.close(5)
    assert drops.count == 2


def test_a_full_disk_drops_and_counts_the_lines():
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        drops = Drops()
        relay = Relay(fd, drops)
        relay.add("one\n")
        relay.close(5)
        assert drops.count == 1
    finally:
        os.close(fd)


def test_a_line_longer_than_max_line_is_dropped_to_its_end(pipe):
    read_end, write_end = pipe
    drops = Drops()
    relay = Relay(write_end, drops)
    relay.feed("worker", b"before\n" + b"y" * (MAX_LINE + 1))
    relay.feed("worker", b"y" * 1000)
    relay.feed("worker", b"yyy\nafter\n")
    assert read_until(read_end, 13) == b"before\nafter\n"
    relay.close(5)
    assert drops.count == 1


# End to end: a master with two workers, its stdout a file or a pipe.

SLOW_READER = """
import os, sys, time
while True:
    data = os.read(0, 4096)
    if not data:
        break
    sys.stdout.buffer.write(data)
    time.sleep(0.0005)
"""
ACCESS = re.compile(r"\S+ \[jetway\.access#info\] GET (/healthz\S*) 200 \(127\.0\.0\.1\) [0-9.]+ms")


def hammer(server: JetwayServer, threads: int, per_thread: int, path_bytes: int) -> List[str]:
    """Concurrent GETs of /healthz with long, distinct query strings; returns the paths asked for."""

    def client(number: int) -> List[str]:
        paths = []
        with requests.Session() as session:
            for n in range(per_thread):
                path = f"/healthz?c{number}-{n}-" + "q" * path_bytes
                assert session.get(server.url(path), timeout=30).status_code == 200
                paths.append(path)
        return paths

    with ThreadPoolExecutor(threads) as pool:
        return [path for paths in pool.map(client, range(threads)) for path in paths]


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_lines_of_two_busy_workers_are_each_whole(redis_server, redis_client, tmp_path, log_format):
    """Lines of ~3 KB, so a turn's lines pass PIPE_BUF: every line parses, none is lost or repeated."""
    server = JetwayServer(
        redis_server.url,
        tmp_path / "busy.log",
        env={"JETWAY_ACCESS_LOG": "on", "JETWAY_LOG_FORMAT": log_format},
    )
    # stdout a pipe, read by another process as supervisor does, slowly: the
    # pipe is often full, so that a write of more than PIPE_BUF is taken in parts.
    read_end, write_end = os.pipe()
    with open(tmp_path / "stdout", "wb") as out:
        reader = subprocess.Popen([sys.executable, "-c", SLOW_READER], stdin=read_end, stdout=out)
    os.close(read_end)
    try:
        server.start(["--workers", "2"], stdout=write_end)
        os.close(write_end)
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "two workers")
        asked = hammer(server, threads=16, per_thread=40, path_bytes=1500)
    finally:
        server.stop()
        reader.wait(30)  # the pipe's last writer is gone: cat ends
        stop_process(reader)
    served = []
    for text in (tmp_path / "stdout").read_text().splitlines()[1:]:  # after the master's banner
        if log_format == "json":
            line = json.loads(text)  # fails on a cut or interleaved line
            if line["namespace"] == "jetway.access":
                served.append(line["path"])
        elif "[jetway.access#info]" in text:
            match = ACCESS.fullmatch(text)
            assert match, text[:200]
            served.append(match.group(1))
        else:
            assert re.match(r"\S+ \[[\w.#-]+\] ", text), text[:200]  # twisted.logger's text lines
    # The start-up health checks have their lines too.
    assert sorted(path for path in served if path.startswith("/healthz?c")) == sorted(asked)


def test_a_stdout_nobody_reads_does_not_stop_the_server(redis_server, redis_client, tmp_path):
    """~20 MB of access lines into a pipe nobody reads: every request is answered, the lines dropped are counted."""
    read_end, write_end = os.pipe()
    server = JetwayServer(redis_server.url, tmp_path / "stuck.log", env={"JETWAY_ACCESS_LOG": "on"})
    try:
        server.start(["--workers", "2"], stdout=write_end)
        os.close(write_end)
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "two workers")
        asked = hammer(server, threads=8, per_thread=300, path_bytes=4000)
        assert len(asked) == 2400
        wait_until(lambda: dropped(server) > 0, 10, "the dropped lines to be counted")
    finally:
        server.stop()
        os.close(read_end)
    assert server.process is None  # stopped within stop_process's wait, stuck stdout and all


def dropped(server: JetwayServer) -> float:
    """jetway_log_lines_dropped_total over the instance (a scrape lands on either worker)."""
    text = requests.get(server.url("/metrics"), timeout=10).text
    samples = [line for line in text.splitlines() if line.startswith("jetway_log_lines_dropped_total")]
    return sum(float(line.split()[-1]) for line in samples)
