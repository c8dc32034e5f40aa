"""The master on ``JETWAY_MASTER_PYTHON``, its workers on the interpreter it started on (``api.master_python``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from api.master_python import CODE_ROOT, MARKER, MASTER_PYTHON, exec_environment, master_python, restore
from tests.api.test_master_gc import environment_of
from tests.support import ROOT, JetwayServer, stop_process, wait_until, worker_pids

CPYTHON = ROOT / ".venv-cpython" / "bin" / "python"  # make test builds it (make setup-cpython)


def interpreter_of(pid: int) -> str:
    """The interpreter binary a process runs (its /proc exe, venvs' symlinks resolved)."""
    return os.path.realpath(f"/proc/{pid}/exe")


def test_unset_empty_or_this_interpreter_runs_the_master_here() -> None:
    assert master_python({}) is None
    assert master_python({MASTER_PYTHON: ""}) is None
    assert master_python({MASTER_PYTHON: sys.executable}) is None
    assert master_python({MASTER_PYTHON: "/usr/bin/python3"}) == "/usr/bin/python3"


def test_the_exec_d_image_execs_no_more_and_puts_back_the_operators_pythonpath() -> None:
    for operators in ({}, {"PYTHONPATH": "/opt/lib"}):
        environment = exec_environment({MASTER_PYTHON: "/usr/bin/python3", **operators})
        assert environment["PYTHONPATH"].split(os.pathsep)[0] == CODE_ROOT
        assert json.loads(environment[MARKER]) == {"PYTHONPATH": operators.get("PYTHONPATH")}
        assert master_python(environment) is None  # exec'd already: no second exec
        restore(environment)
        assert environment == {MASTER_PYTHON: "/usr/bin/python3", **operators}


@pytest.mark.parametrize(
    ("named", "says"),
    [
        ("/nonexistent/python", "no such interpreter"),
        ("/usr/bin/python3", "cannot import what the master needs"),  # Debian's, without the requirements
    ],
)
def test_an_interpreter_that_cannot_run_the_master_is_a_one_line_error_and_exit_2(named: str, says: str) -> None:
    if named == "/usr/bin/python3" and not Path(named).exists():
        pytest.skip("no /usr/bin/python3 here")
    ran = subprocess.run(
        [sys.executable, "-m", "api", "serve", "--port", "1"],
        cwd=ROOT,
        env={**os.environ, MASTER_PYTHON: named},
        capture_output=True,
        timeout=60,
    )
    assert ran.returncode == 2
    lines = ran.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and named in lines[0], ran.stderr


def test_a_cpython_master_runs_pypy_workers_that_serve_reload_and_drain(redis_server, tmp_path) -> None:
    """The master's image is CPython, its workers the interpreter the command named, before and after a
    SIGHUP; the workers see the operator's PYTHONPATH, not the master's; SIGTERM ends all with 0."""
    assert CPYTHON.exists(), "make test builds .venv-cpython (make setup-cpython)"
    env = {MASTER_PYTHON: str(CPYTHON), "PYTHONPATH": str(tmp_path)}
    server = JetwayServer(redis_server.url, tmp_path / "master.log", env=env)
    try:
        server.start(["--workers", "2"])
        master = server.process.pid  # type: ignore[union-attr]
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "both workers")
        assert interpreter_of(master) == os.path.realpath(CPYTHON)
        first = worker_pids(server)
        for pid in first:
            assert interpreter_of(pid) == os.path.realpath(sys.executable)
            worker = environment_of(pid)
            assert worker["PYTHONPATH"] == str(tmp_path) and MARKER not in worker
        requests.put(server.url("/v1/things/t1"), json={"a": 1}, timeout=10).raise_for_status()
        assert requests.get(server.url("/v1/things/t1"), timeout=10).json() == {"a": 1}

        server.process.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        replaced = lambda: len(worker_pids(server)) == 2 and not set(worker_pids(server)) & set(first)  # noqa: E731
        wait_until(replaced, 60, "both workers replaced")
        for pid in worker_pids(server):
            assert interpreter_of(pid) == os.path.realpath(sys.executable)
        assert requests.get(server.url("/v1/things/t1"), timeout=10).json() == {"a": 1}

        process = server.process
        server.process = None
        assert process is not None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if server.process is not None:
            stop_process(server.process)
        server.stop()
