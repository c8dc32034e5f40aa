"""The master process: one socket per worker slot, respawn, drain, reload.

Everything runs through real HTTP against a real master with 2 workers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest
import requests

from api.master import DEFAULT_GC_ENVIRONMENT, worker_environment
from tests.proc_sockets import established_by_pid
from tests.support import (
    ROOT,
    JetwayServer,
    SteadyClient,
    free_port,
    stop_process,
    wait_every_worker_serving,
    wait_until,
    worker_pids,
)

WORKERS = 2


@pytest.fixture
def master(redis_server, redis_client, tmp_path) -> Iterator[JetwayServer]:
    server = JetwayServer(redis_server.url, tmp_path / "master.log", env={"JETWAY_GRACE": "5"})
    try:
        server.start(["--workers", str(WORKERS)])
        wait_every_worker_serving(server, WORKERS)
        yield server
    finally:
        server.stop()


def get_healthz(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b'"ok"}' not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_every_request_of_a_burst_is_answered(master):
    def put(n: int) -> int:
        body = b'{"n":%d}' % n
        return requests.put(
            master.url(f"/v1/burst/d{n}"), data=body, headers={"Content-Type": "application/json"}, timeout=10
        ).status_code

    with ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(put, range(300)))
    assert statuses == [201] * 300
    listed = requests.get(master.url("/v1/burst?limit=1000"), timeout=10).json()["items"]
    assert len(listed) == 300


def test_connections_spread_over_the_workers(master):
    """64 connections opened at once: no worker holds more than 75%."""
    connections = [socket.create_connection(("127.0.0.1", master.port)) for _ in range(64)]
    try:
        for sock in connections:
            assert b"200 OK" in get_healthz(sock)
        held = established_by_pid(master.port)
    finally:
        for sock in connections:
            sock.close()
    # The 64, plus any connection a health check left open.
    assert set(held) == set(worker_pids(master)) and sum(held.values()) >= 64, held
    assert max(held.values()) <= 0.75 * sum(held.values()), f"connections per worker: {held}"


def test_a_killed_worker_is_replaced_and_service_goes_on(master):
    victim = worker_pids(master)[0]
    with SteadyClient(master.base) as client:
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: len(worker_pids(master)) == WORKERS and victim not in worker_pids(master), 10, "a new worker"
        )
        time.sleep(0.5)
    print(f"\nSIGKILL of a worker: {client.ok} requests answered, {len(client.failures)} failed: {client.failures}")
    assert client.ok > 0
    # A request the killed worker was holding may fail; queued ones must not.
    assert len(client.failures) <= 4, client.failures


# A worker started while this file exists stops before it runs anything, as one still starting would.
HELD_START = """import os, time
while os.path.exists({gate!r}):
    time.sleep(0.1)
"""


def held_start_server(redis_server, tmp_path) -> Tuple[JetwayServer, Path]:
    """A server (not started) whose workers started while the file returned exists wait before running anything."""
    code, gate = tmp_path / "code", tmp_path / "hold"
    code.mkdir()
    (code / "sitecustomize.py").write_text(HELD_START.format(gate=str(gate)))
    path = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    env = {"JETWAY_GRACE": "5", "PYTHONPATH": path}
    return JetwayServer(redis_server.url, tmp_path / "master.log", env=env), gate


def test_while_a_killed_workers_successor_starts_new_connections_go_to_the_live_one(
    redis_server, redis_client, tmp_path
):
    """Not one waits on the dead slot's socket for its successor (api.steering)."""
    server, gate = held_start_server(redis_server, tmp_path)
    try:
        server.start(["--workers", str(WORKERS)])
        wait_every_worker_serving(server, WORKERS)
        victim, survivor = worker_pids(server)
        gate.touch()
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(set(worker_pids(server)) - {victim, survivor}) == 1, 20, "its successor to start")
        [successor] = set(worker_pids(server)) - {victim, survivor}
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: requests.get(server.url("/healthz"), timeout=10).status_code, range(64)))
        assert statuses == [200] * 64
        assert gate.exists() and successor not in established_by_pid(server.port)  # still held back
        gate.unlink()
        wait_until(lambda: requests.get(server.url("/healthz"), timeout=5).status_code == 200, 20, "the successor")
    finally:
        if gate.exists():
            gate.unlink()
        server.stop()


def test_connections_queued_for_a_worker_as_it_dies_are_answered_by_the_live_one(redis_server, redis_client, tmp_path):
    """Those the kernel had queued on its slot's socket are handed over (api.handoff), not kept for its successor."""
    server, gate = held_start_server(redis_server, tmp_path)
    try:
        server.start(["--workers", str(WORKERS)])
        wait_every_worker_serving(server, WORKERS)
        victim = worker_pids(server)[0]
        gate.touch()
        os.kill(victim, signal.SIGSTOP)  # it accepts nothing more: its share of new connections queues
        with ThreadPoolExecutor(32) as pool:
            asked = [pool.submit(requests.get, server.url("/healthz"), timeout=20) for _ in range(32)]
            wait_until(lambda: sum(future.done() for future in asked) < 32, 5, "connections queued")
            time.sleep(0.5)
            os.kill(victim, signal.SIGKILL)
            statuses = [future.result().status_code for future in asked]
        assert statuses == [200] * 32
        assert gate.exists()  # answered while its successor was still held back
        # The master writes that line after it hands the last one over, so a worker may answer it first.
        wait_until(
            lambda: "queued connections handed to the serving workers" in Path(server.log_path).read_text(),
            5,
            "the master's log of the handoff",
        )
    finally:
        if gate.exists():
            gate.unlink()
        server.stop()


def test_sigterm_lets_50_requests_in_flight_complete(master, redis_server):
    assert requests.put(
        master.url("/v1/things/a"), data=b'{"a":1}', headers={"Content-Type": "application/json"}, timeout=10
    ).status_code in (200, 201)
    pauser = redis_server.client()
    # Hold every Redis reply for 1.5 s so the requests really are in flight.
    pauser.execute_command("CLIENT", "PAUSE", 1500, "ALL")
    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(requests.get, master.url("/v1/things/a"), timeout=20) for _ in range(50)]
        time.sleep(0.5)
        started = time.monotonic()
        master.process.send_signal(signal.SIGTERM)
        statuses = [future.result().status_code for future in futures]
    assert statuses == [200] * 50
    assert master.process.wait(10) == 0
    assert time.monotonic() - started < 5 + 1, "the master outlived its grace period"


@pytest.mark.slow
def test_sighup_replaces_the_workers_with_no_failed_request(master):
    before = worker_pids(master)
    with SteadyClient(master.base) as client:
        time.sleep(0.5)
        master.process.send_signal(signal.SIGHUP)
        wait_until(lambda: not set(before) & set(worker_pids(master)), 20, "every worker to be replaced")
        time.sleep(0.5)
    assert len(worker_pids(master)) == WORKERS
    print(f"\nSIGHUP: {client.ok} requests answered, {len(client.failures)} failed")
    assert client.ok > 0
    assert client.failures == []


# The code a worker starts with, as a sitecustomize on PYTHONPATH the test rewrites (a deploy between
# two SIGHUPs): each process it starts in records its pid under ``started``, named by its version.
STARTED_WITH = """import os, time
from pathlib import Path
Path({started!r}, str(os.getpid())).write_text({version!r})
time.sleep({pause})
"""


@pytest.mark.slow
def test_of_two_sighups_during_one_reload_the_second_ones_code_serves_after(redis_server, redis_client, tmp_path):
    """Every HUP during a reload makes one more reload after it, not one each, nor none."""
    code, started = tmp_path / "code", tmp_path / "started"
    code.mkdir()
    started.mkdir()

    def deploy(version: str, pause: float = 0.0) -> None:
        (code / "sitecustomize.py").write_text(STARTED_WITH.format(started=str(started), version=version, pause=pause))

    def workers_started() -> List[Path]:
        """Every worker ever started, oldest first (the master records itself too)."""
        marks = [mark for mark in started.iterdir() if mark.name != str(server.process.pid)]
        return sorted(marks, key=lambda mark: mark.stat().st_mtime_ns)

    def last_started() -> Set[int]:
        return {int(mark.name) for mark in workers_started()[-WORKERS:]}

    def serving() -> List[str]:
        return sorted((started / str(pid)).read_text() for pid in worker_pids(server))

    deploy("v1")
    path = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    server = JetwayServer(redis_server.url, tmp_path / "master.log", env={"JETWAY_GRACE": "5", "PYTHONPATH": path})
    try:
        server.start(["--workers", str(WORKERS)])
        wait_until(lambda: serving() == ["v1"] * WORKERS, 10, "both workers")
        # v2's workers take a second to start: its reload is under way while v3 is deployed.
        deploy("v2", pause=1.0)
        server.process.send_signal(signal.SIGHUP)
        wait_until(lambda: len(workers_started()) > WORKERS, 30, "the reload to start a v2 worker")
        deploy("v3")
        server.process.send_signal(signal.SIGHUP)
        server.process.send_signal(signal.SIGHUP)
        # Two reloads: the slots' first workers, then one per slot per reload, and the last reload's serve.
        wait_until(
            lambda: len(workers_started()) == 3 * WORKERS and set(worker_pids(server)) == last_started(),
            60,
            "the second reload's workers alone serving",
        )
        time.sleep(1.0)  # a third reload, had the two HUPs made two, would have started a worker by now
        assert len(workers_started()) == 3 * WORKERS
        assert serving() == ["v3"] * WORKERS
        assert requests.get(server.url("/healthz"), timeout=5).status_code == 200
    finally:
        server.stop()


def run_serve(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "api", "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_a_busy_port_is_a_one_line_error_and_exit_2():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        result = run_serve("--port", str(holder.getsockname()[1]))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "already in use" in result.stderr


@pytest.mark.parametrize("host", ["not-an-address", "999.1.1.1", "192.0.2.1"])
def test_a_bad_address_is_a_one_line_error_and_exit_2(host):
    result = run_serve("--host", host, "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("jetway: ") and result.stderr.strip().count("\n") == 0, result.stderr


def test_dual_stack_answers_ipv4_and_ipv6(redis_server, redis_client, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "dual.log")
    server.base = f"http://[::1]:{server.port}"
    try:
        server.start(["--host", "::", "--workers", "1"])
        for base in (f"http://127.0.0.1:{server.port}", f"http://[::1]:{server.port}"):
            assert requests.get(base + "/healthz", timeout=5).status_code == 200
    finally:
        server.stop()


@pytest.mark.slow
def test_a_worker_adopts_a_socket_opened_by_another_parent(redis_server, redis_client, tmp_path):
    """``python -m api worker --fd N``, as supervisor would start it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    env = {**os.environ, "REDIS_URL": redis_server.url}
    with open(tmp_path / "worker.log", "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "api", "worker", "--fd", str(listener.fileno())],
            cwd=ROOT,
            env=env,
            pass_fds=[listener.fileno()],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        listener.close()
        wait_until(
            lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, 20, "the worker"
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0
    finally:
        stop_process(worker)


def test_workers_get_pypy_gc_settings_unless_the_environment_names_its_own(master):
    for pid in worker_pids(master):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        for name, default in DEFAULT_GC_ENVIRONMENT.items():
            assert f"{name}={os.environ.get(name, default)}".encode() in environ
    assert worker_environment({"A": "1"}) == {"A": "1", **DEFAULT_GC_ENVIRONMENT}
    assert worker_environment({"PYPY_GC_NURSERY": "16MB"})["PYPY_GC_NURSERY"] == "16MB"
