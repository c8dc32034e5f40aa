"""The requirements install cleanly on PyPy 3.9 and CPython 3.11.

cyclone 1.3 pins ``twisted==19.2.1`` in its metadata; it is installed with
``--no-deps`` (requirements-nodeps.txt) so that pin cannot drag in an old
Twisted. These tests check that outcome on both interpreters.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support import ROOT, JetwayServer

CPYTHON = ROOT / ".venv-cpython" / "bin" / "python"


def _pip_check(python: Path) -> list:
    result = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    return [line for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("python", [Path(sys.executable), CPYTHON], ids=["this-interpreter", "cpython"])
def test_only_cyclones_stale_pins_are_unmet(python):
    """pip check complains about cyclone's 2019 pins and nothing else."""
    complaints = _pip_check(python)
    assert complaints, "expected pip check to report cyclone's pins"
    assert all(line.startswith("cyclone 1.3 ") for line in complaints), complaints


@pytest.mark.parametrize("python", [Path(sys.executable), CPYTHON], ids=["this-interpreter", "cpython"])
def test_a_current_twisted_is_installed(python):
    version = subprocess.run(
        [str(python), "-c", "import twisted, cyclone.web; print(twisted.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert int(version.split(".")[0]) >= 25, version


def test_suite_runs_on_pypy():
    assert platform.python_implementation() == "PyPy"


def test_the_same_code_serves_on_cpython(redis_server, redis_client, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "cpython.log", python=str(CPYTHON))
    try:
        server.start()
        body = b'{"name":"ada","n":[1,2.5,null]}'
        created = requests.put(
            server.url("/v1/users/u1"), data=body, headers={"Content-Type": "application/json"}, timeout=10
        )
        assert created.status_code == 201
        patched = requests.patch(
            server.url("/v1/users/u1"),
            data=b'{"n":null,"city":"\xc3\xa9/x"}',
            headers={"Content-Type": "application/merge-patch+json"},
            timeout=10,
        )
        # ujson on CPython: compact, no escaped slash, UTF-8 kept as is.
        assert patched.content == '{"name":"ada","city":"é/x"}'.encode()
    finally:
        server.stop()
