"""What ``make run`` shows a new user before it serves: a few lines, each useful (issue #61).

``make run`` itself, as a user types it, with its private Redis in a
temporary ``VAR`` and a free ``PORT``, its workers warming up as they do by
default: at most ten lines up to the master's "serving on", none of them
Twisted's talk about its factories and ports, one line per worker with its
slot, pid and warm-up; the master on CPython, its workers on PyPy. Then a
Ctrl-C (SIGINT to its process group, as a terminal sends it) stops it, and
the private Redis is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import List

import pytest

from tests.support import ROOT, free_port, stop_process, wait_until

WORKERS = 2
MAX_LINES = 10
_WORKER = re.compile(
    r"\S+Z info  worker (\d) \(pid \d+\) serving on :(\d+): "
    r"warm-up \d+ requests in [0-9.]+ s.*, on Redis \d+ requests in .*"
)


@pytest.mark.slow
def test_make_run_says_little_before_it_serves(tmp_path: Path) -> None:
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith(("REDIS_URL", "JETWAY_"))}
    env["JETWAY_WORKERS"] = str(WORKERS)
    make = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"PORT={port}", f"VAR={tmp_path / 'var'}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: List[str] = []
    reading = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in make.stdout), daemon=True)
    reading.start()
    try:
        wait_until(lambda: any(" jetway: serving on " in line for line in lines), 90, f"make run to serve: {lines}")
        before = lines[: next(n for n, line in enumerate(lines) if " jetway: serving on " in line)]
        # The master on CPython, its workers on PyPy (api.master_python; the Makefile's run).
        (master,) = Path(f"/proc/{make.pid}/task/{make.pid}/children").read_text().split()
        assert os.path.realpath(f"/proc/{master}/exe") == os.path.realpath(ROOT / ".venv-cpython" / "bin" / "python")
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        pypy = os.path.realpath(ROOT / ".venv" / "bin" / "python")
        assert {os.path.realpath(f"/proc/{pid}/exe") for pid in children} == {pypy}
        os.killpg(make.pid, signal.SIGINT)
        make.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(make.pid, signal.SIGTERM)
        stop_process(make)
        pid_file = tmp_path / "var" / "redis.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
    reading.join(10)
    make.stdout.close()  # type: ignore[union-attr]
    assert len(before) <= MAX_LINES, "\n".join(before)
    assert not [line for line in lines if "factory" in line.lower() or "0x" in line or "Port" in line], lines
    # The venv's install lines come first only when it is being installed.
    first = next(n for n, line in enumerate(before) if line.startswith("private Redis on unix:"))
    token, curl, starting, *workers = before[first + 1 :]
    assert token.startswith("development token") and "Authorization: Bearer jw_" in curl, before
    assert f"http://127.0.0.1:{port}/" in curl, before
    assert re.fullmatch(rf"\S+Z info  jetway: starting {WORKERS} workers on http://127\.0\.0\.1:{port}; .*", starting)
    starts = [_WORKER.fullmatch(line) for line in workers]
    assert all(starts) and sorted(int(start.group(1)) for start in starts) == list(range(WORKERS)), workers  # type: ignore[union-attr]
    assert {start.group(2) for start in starts} == {str(port)}  # type: ignore[union-attr]
    # Ctrl-C: the master drains and says so, at info like everything it said since it started.
    drained = next(n for n, line in enumerate(lines) if "workers drained; stopping" in line)
    assert all(re.match(r"\S+Z info  ", line) for line in lines[first + 3 : drained + 1]), lines
