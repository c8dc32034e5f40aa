"""api.log_relay: the workers' lines reach the master's stdout whole, and a stuck stdout stops nobody."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

import pytest
import requests

from api.log_relay import MAX_LINE, MAX_OWN_LINES, Relay
from tests.process.test_master import worker_pids
from tests.support import ClientThreads, JetwayServer, stop_process, wait_until


class Drops:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, lines: int) -> None:
        with self.lock:  # counted from the relay's thread too
            self.count += lines


def read_until(fd: int, size: int, timeout: float = 10.0) -> bytes:
    """What the pipe gives until ``size`` bytes came, ``timeout`` passed, or nothing came for a second."""
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < size and time.monotonic() < deadline:
        if not select.select([fd], [], [], 1.0)[0]:
            break
        data += os.read(fd, 1 << 16)
    return data


def test_lines_written_in_pieces_to_two_pipes_come_out_whole(pipe):
    read_end, write_end = pipe
    relay = Relay(write_end, Drops(), interval=0.005)
    sources = [os.pipe() for _ in range(2)]
    for number, (source_read, _) in enumerate(sources):
        relay.watch(number, source_read)
    sent = [b"".join(b'{"source": %d, "n": %d}\n' % (number, n) for n in range(300)) for number in range(2)]
    for start in range(0, len(sent[0]), 7):  # odd-sized pieces, alternating, read as they come
        for number, (_, source_write) in enumerate(sources):
            os.write(source_write, sent[number][start : start + 7])
        if start % 700 == 0:
            time.sleep(0.002)
    for _, source_write in sources:
        os.close(source_write)
    out = read_until(read_end, sum(map(len, sent)))
    relay.close(5)
    lines = out.splitlines(keepends=True)
    for number in range(2):
        assert [line for line in lines if b'"source": %d' % number in line] == sent[number].splitlines(keepends=True)
    assert len(lines) == 600


def test_a_line_a_worker_left_unfinished_is_dropped_not_passed_on_cut(pipe):
    read_end, write_end = pipe
    drops = Drops()
    relay = Relay(write_end, drops, interval=0.005)
    source_read, source_write = os.pipe()
    relay.watch("worker", source_read)
    os.write(source_write, b"whole\nhal")
    os.close(source_write)  # the worker ended
    time.sleep(0.1)
    relay.add("next\n")
    assert read_until(read_end, 11) == b"whole\nnext\n"
    relay.close(5)
    assert drops.count == 1


def test_a_stdout_nobody_reads_blocks_only_the_relay_thread(pipe):
    read_end, write_end = pipe
    drops = Drops()
    relay = Relay(write_end, drops, interval=0.005)
    started = time.monotonic()
    total = 3 * MAX_OWN_LINES
    for n in range(total):  # 6 MB of the master's own lines: the pipe holds 64 KiB
        relay.add(f"{n:06d} {'x' * 192}\n")
    relay.close(0.5)  # the thread is stuck in a write: close gives up after the timeout
    assert time.monotonic() - started < 10
    assert drops.count > 0
    # Once read, what was kept is whole lines, in order, and all of it comes.
    kept = read_until(read_end, 1 << 30, timeout=5).splitlines()
    assert all(len(line) == 199 for line in kept)
    numbers = [int(line[:6]) for line in kept]
    assert numbers == sorted(numbers)
    assert len(kept) + drops.count == total


def test_a_masters_line_comes_after_the_workers_line_written_before_it(pipe):
    """A worker logs that it serves, then says ready; the master's "serving on" it causes comes after that line."""
    read_end, write_end = pipe
    relay = Relay(write_end, Drops(), interval=3600)  # one pass: the last, at close
    source_read, source_write = os.pipe()
    relay.watch("worker", source_read)
    os.write(source_write, b"worker 0 serving\n")
    relay.add("jetway: serving\n")
    os.close(source_write)
    relay.close(5)
    assert read_until(read_end, 33) == b"worker 0 serving\njetway: serving\n"


def test_a_closed_stdout_drops_and_counts_the_lines(pipe):
    read_end, write_end = pipe
    os.close(read_end)
    drops = Drops()
    relay = Relay(write_end, drops)
    relay.add("one\n")
    relay.add("two\n")
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
    relay = Relay(write_end, drops, interval=0.005)
    source_read, source_write = os.pipe()
    relay.watch("worker", source_read)

    def worker() -> None:
        for piece in (b"before\n", b"y" * (3 * MAX_LINE), b"yyy\nafter\n"):
            os.write(source_write, piece)  # blocks while the relay reads: a thread of its own
        os.close(source_write)

    writing = threading.Thread(target=worker)
    writing.start()
    assert read_until(read_end, 13) == b"before\nafter\n"
    writing.join(10)
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
ACCESS = re.compile(r"\S+Z info  GET (/healthz\S*) 200 \(127\.0\.0\.1\) [0-9.]+ms request_id=[0-9a-f]{32}")


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
@pytest.mark.parametrize("stdout", ["pipe", "file"])
@pytest.mark.slow
def test_lines_of_two_busy_workers_are_each_whole(redis_server, redis_client, tmp_path, log_format, stdout):
    """Lines of ~3 KB, so a turn's lines pass PIPE_BUF: every line parses, none is lost or repeated.

    Into a pipe the master relays them; into a file the workers write them themselves.
    """
    server = JetwayServer(
        redis_server.url,
        tmp_path / "busy.log",
        env={"JETWAY_ACCESS_LOG": "on", "JETWAY_LOG_FORMAT": log_format},
    )
    reader = None
    try:
        if stdout == "pipe":
            # Read by another process as supervisor does, slowly: the pipe is
            # often full, so that a write of more than PIPE_BUF is taken in parts.
            read_end, write_end = os.pipe()
            with open(tmp_path / "stdout", "wb") as out:
                reader = subprocess.Popen([sys.executable, "-c", SLOW_READER], stdin=read_end, stdout=out)
            os.close(read_end)
            server.start(["--workers", "2"], stdout=write_end)
            os.close(write_end)
        else:
            with open(tmp_path / "stdout", "ab") as out:
                server.start(["--workers", "2"], stdout=out.fileno())
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "two workers")
        relayed = {pid: relays_log(pid) for pid in worker_pids(server)}
        asked = hammer(server, threads=16, per_thread=40, path_bytes=1500)
    finally:
        server.stop()
        if reader is not None:
            reader.wait(30)  # the pipe's last writer is gone: the reader ends
            stop_process(reader)
    assert set(relayed.values()) == {stdout == "pipe"}
    served = []
    for text in (tmp_path / "stdout").read_text().splitlines():
        if log_format == "json":
            line = json.loads(text)  # fails on a cut or interleaved line
            if line["namespace"] == "jetway.access":
                served.append(line["path"])
        elif " GET /healthz" in text:
            match = ACCESS.fullmatch(text)
            assert match, text[:200]
            served.append(match.group(1))
        else:
            assert re.match(r"\S+Z (?:info |warn |error|critical) \S", text), text[:200]  # api.logs.text_line
    # The start-up health checks have their lines too.
    assert sorted(path for path in served if path.startswith("/healthz?c")) == sorted(asked)


def relays_log(pid: int) -> bool:
    """The worker ``pid`` was started to write its log into a pipe for the master to relay."""
    return b"--log-pipe" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


@pytest.mark.slow
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


class NumberedClient(ClientThreads):
    """GETs of /healthz?relay-N-M on fresh connections; keeps the paths that were answered 200."""

    def __init__(self, base: str, threads: int = 4) -> None:
        super().__init__(threads)
        self.base = base
        self.answered: List[str] = []

    def run_client(self, number: int) -> None:
        sent = 0
        while not self.stopping.is_set():
            path = f"/healthz?relay-{number}-{sent}"
            sent += 1
            try:
                ok = requests.get(self.base + path, timeout=10).status_code == 200
            except requests.RequestException:
                ok = False  # the port refused during the shutdown: no answer, no line owed
                time.sleep(0.01)
            if ok:
                with self.lock:
                    self.answered.append(path)


@pytest.mark.slow
def test_workers_replaced_by_sighup_or_stopped_by_sigterm_leave_every_line(redis_server, redis_client, tmp_path):
    """Every request answered before, across a SIGHUP and up to the SIGTERM has its access line, once."""
    server = JetwayServer(
        redis_server.url, tmp_path / "reload.log", env={"JETWAY_ACCESS_LOG": "on", "JETWAY_GRACE": "5"}
    )
    with open(tmp_path / "stdout", "wb") as out:
        try:
            server.start(["--workers", "2"], stdout=out.fileno())
            wait_until(lambda: len(worker_pids(server)) == 2, 10, "two workers")
            before = worker_pids(server)
            with NumberedClient(server.base) as client:
                time.sleep(0.5)
                server.process.send_signal(signal.SIGHUP)
                wait_until(lambda: not set(before) & set(worker_pids(server)), 30, "every worker to be replaced")
                time.sleep(0.5)
                # Stopped while the clients still send: the draining workers' last lines must come too.
                server.process.send_signal(signal.SIGTERM)
                assert server.process.wait(20) == 0
        finally:
            server.stop()
    logged = []
    for text in (tmp_path / "stdout").read_text().splitlines()[1:]:  # after the master's banner
        line = json.loads(text)
        if line["namespace"] == "jetway.access" and line["path"].startswith("/healthz?relay-"):
            logged.append(line["path"])
    assert client.answered, "no request was answered"
    print(f"\nSIGHUP then SIGTERM: {len(client.answered)} answered, {len(logged)} logged")
    assert sorted(logged) == sorted(client.answered)
