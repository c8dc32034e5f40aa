"""Signals against a real master in a process group of its own, as ``make run`` in a terminal is.

Only the master handles SIGHUP: a hangup of the whole group (a closing
terminal, ``kill -HUP -PGID``) reloads the workers one slot at a time and
fails no request; a worker given SIGHUP alone ignores it. SIGTERM drains
with no traceback in the log, also when it comes while a worker warms up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
import requests

from tests.support import ROOT, JetwayServer, SteadyClient, stop_process, wait_until, worker_pids

WORKERS = 2
# What a log must never hold after a signal.
TRACEBACK_SIGNS = ("Traceback", "ReactorNotRunning", '"level": "critical"', '"level": "error"')


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` handles ``signum``: a worker handles SIGTERM from its reactor's start, and it starts with
    its warm-up; SIGUSR2 from run_worker's first lines, before which it would die of one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


class GroupLeader(JetwayServer):
    """The master started in a session (so a process group) of its own."""

    def start(self, args: Optional[List[str]] = None, stdout: Optional[int] = None) -> GroupLeader:
        command = [self.python, "-m", "api", "serve", "--port", str(self.port), *(args or [])]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_until(self._healthy, 30, f"jetway on port {self.port} (log: {self.log_path})")
        return self


@pytest.fixture
def leader(redis_server, redis_client, tmp_path) -> Iterator[GroupLeader]:
    server = GroupLeader(redis_server.url, tmp_path / "master.log", env={"JETWAY_GRACE": "5"})
    try:
        server.start(["--workers", str(WORKERS)])
        wait_until(lambda: len(worker_pids(server)) == WORKERS, 10, "both workers")
        yield server
    finally:
        server.stop()


def log_text(server: JetwayServer) -> str:
    return Path(server.log_path).read_text(errors="replace")


def signal_mask(pid: int, field: str) -> int:
    """``SigIgn``, ``SigBlk``… of ``pid``, as a bit set (bit n-1 is signal n)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} for {pid}")


class Watch(threading.Thread):
    """Samples the master's live workers every 20 ms: the fewest seen, and every pid seen."""

    def __init__(self, server: JetwayServer) -> None:
        super().__init__()
        self.server = server
        self.fewest = WORKERS
        self.seen: List[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            live = [pid for pid in worker_pids(self.server) if Path(f"/proc/{pid}").exists()]
            self.fewest = min(self.fewest, len(live))
            self.seen.extend(pid for pid in live if pid not in self.seen)
            time.sleep(0.02)


def test_a_worker_ignores_sighup_from_its_start(leader):
    """Born with SIGHUP held, then ignoring it: a hangup sent to a worker alone changes nothing."""
    before = worker_pids(leader)
    hup = 1 << (signal.SIGHUP - 1)
    for pid in before:
        # Ignored once it runs, held until then (a worker may still be starting: /healthz had one answer).
        assert (signal_mask(pid, "SigIgn") | signal_mask(pid, "SigBlk")) & hup
        os.kill(pid, signal.SIGHUP)
    wait_until(lambda: all(signal_mask(pid, "SigIgn") & hup for pid in before), 20, "every worker to run")
    assert not any(signal_mask(pid, "SigBlk") & hup for pid in before)
    assert worker_pids(leader) == before
    assert requests.get(leader.url("/healthz"), timeout=5).status_code == 200


def test_sigusr2_writes_each_process_stacks_and_changes_nothing(leader):
    """A worker's and the master's stacks, every thread's, to their stderr (this log); each serves on.

    Each main thread's stack ends in the call that runs its reactor (what is above it depends on the moment:
    an idle reactor's is in doPoll, one in CI was elsewhere), the last line the dump writes for that thread.
    """
    before = worker_pids(leader)
    for pid, bottom in ((before[0], "api/worker.py"), (leader.process.pid, "api/master.py")):  # type: ignore[union-attr]
        assert bottom not in log_text(leader)
        wait_until(lambda: catches(pid, signal.SIGUSR2), 30, f"{pid} to handle SIGUSR2")  # noqa: B023
        os.kill(pid, signal.SIGUSR2)
        wait_until(lambda: bottom in log_text(leader), 10, f"the stacks of {pid}")  # noqa: B023
    assert log_text(leader).count("Current thread") == 2
    assert worker_pids(leader) == before and leader.process.poll() is None
    assert requests.get(leader.url("/healthz"), timeout=5).status_code == 200


@pytest.mark.slow
def test_a_hangup_of_the_whole_group_under_load_fails_no_request(leader):
    """``kill -HUP -PGID``: the master reloads one slot at a time, no slot is ever left empty, no request fails."""
    before = worker_pids(leader)
    assert os.getpgid(leader.process.pid) == leader.process.pid != os.getpgid(0)
    watch = Watch(leader)
    watch.start()
    try:
        with SteadyClient(leader.base) as client:
            time.sleep(0.5)
            os.killpg(leader.process.pid, signal.SIGHUP)
            wait_until(lambda: not set(before) & set(worker_pids(leader)), 30, "every worker to be replaced")
            time.sleep(0.5)
    finally:
        watch.stopping.set()
        watch.join(5)
    client.report("kill -HUP -PGID")
    assert client.ok > 0
    assert client.failures == []
    assert len(worker_pids(leader)) == WORKERS
    # Replaced, never lost: each new worker started before an old one went, none died unasked.
    assert watch.fewest >= WORKERS, f"only {watch.fewest} workers alive at one point"
    assert "restarting in" not in log_text(leader)


def test_sigterm_under_load_logs_no_traceback(leader):
    with SteadyClient(leader.base):
        time.sleep(0.5)
        leader.process.send_signal(signal.SIGTERM)
        assert leader.process.wait(15) == 0
    text = log_text(leader)
    assert "draining workers" in text
    assert [sign for sign in TRACEBACK_SIGNS if sign in text] == []


def test_sigterm_while_the_workers_warm_up_stops_them_quietly(redis_server, redis_client, tmp_path):
    """A stop during the warm-up (before a worker serves) ends it with 0 and no traceback."""
    server = GroupLeader(redis_server.url, tmp_path / "warm.log", env={"JETWAY_WARM_UP": "200000"})
    with open(server.log_path, "ab") as log:  # not start(): it waits for /healthz, which comes after the warm-up
        server.process = subprocess.Popen(
            [sys.executable, "-m", "api", "serve", "--port", str(server.port), "--workers", "1"],
            cwd=ROOT,
            env=server.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        warming = lambda: worker_pids(server) and catches(worker_pids(server)[0], signal.SIGTERM)  # noqa: E731
        wait_until(warming, 30, "the warm-up to start")
        worker = worker_pids(server)[0]
        os.kill(worker, signal.SIGTERM)
        wait_until(lambda: "worker of slot 0 ended" in log_text(server), 10, "the master to see the worker end")
        text = log_text(server)
        assert "exit code 0" in text, text[-2000:]
        assert [sign for sign in TRACEBACK_SIGNS if sign in text] == []
    finally:
        stop_process(server.process)
