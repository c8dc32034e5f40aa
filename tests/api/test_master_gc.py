"""The master runs with its own PyPy GC settings; the workers get the operator's (``api.master_gc``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict

import pytest

from api.master import DEFAULT_GC_ENVIRONMENT
from api.master_gc import MARKER, MASTER_GC_ENVIRONMENT, exec_environment, restore
from tests.support import JetwayServer, wait_until, worker_pids


def environment_of(pid: int) -> Dict[str, str]:
    """The environment a process was started (or last exec'd) with."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


def test_the_exec_adds_the_master_settings_and_remembers_the_operators() -> None:
    environment = exec_environment({"PATH": "/bin", "PYPY_GC_NURSERY": "4MB"})
    assert environment is not None
    assert environment["PYPY_GC_NURSERY"] == MASTER_GC_ENVIRONMENT["PYPY_GC_NURSERY"]
    assert json.loads(environment[MARKER]) == {"PYPY_GC_NURSERY": "4MB"}


def test_the_exec_d_image_execs_no_more_and_restores_set_and_unset_values() -> None:
    chosen = exec_environment({"PYPY_GC_NURSERY": "4MB"})
    unset = exec_environment({})
    assert chosen is not None and unset is not None
    assert exec_environment(chosen) is None
    restore(chosen)
    restore(unset)
    assert chosen == {"PYPY_GC_NURSERY": "4MB"}
    assert unset == {}


@pytest.mark.skipif(sys.implementation.name != "pypy", reason="the master execs itself on PyPy only")
@pytest.mark.parametrize("operators", [None, "4MB"])
def test_a_served_master_has_its_nursery_and_its_workers_the_operators(redis_server, tmp_path, operators) -> None:
    """Unset: the workers get Jetway's default nursery; set by the operator: the workers get that value."""
    env = {"PYPY_GC_NURSERY": operators} if operators else {}
    server = JetwayServer(redis_server.url, tmp_path / "master.log", env=env)
    if not operators:
        server.env.pop("PYPY_GC_NURSERY", None)
    try:
        server.start(["--workers", "2"])
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "both workers")
        master = environment_of(server.process.pid)  # type: ignore[union-attr]
        assert master["PYPY_GC_NURSERY"] == MASTER_GC_ENVIRONMENT["PYPY_GC_NURSERY"]
        for pid in worker_pids(server):
            worker = environment_of(pid)
            assert worker["PYPY_GC_NURSERY"] == (operators or DEFAULT_GC_ENVIRONMENT["PYPY_GC_NURSERY"])
            assert MARKER not in worker
    finally:
        server.stop()
