"""What the studies share: one worker served as ``_request_path --child`` runs it, and their reports.

``serve_one`` starts the worker (production defaults, authorization and the
access log on; vmprof on ``SIGUSR1``, its profile written to the returned
path when it stops) under ``Processes``, which stops it whatever happens.
``append_report`` adds a run's section to a report under loadtest/results/.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from loadtest._servers import Processes, free_port, http_ok, wait_until
from loadtest._token import ROOT
from loadtest.studies._request_path import _child_env


def serve_one(
    processes: Processes,
    python: Path,
    redis_url: str,
    token: str,
    scratch: Path,
    env: Optional[Dict[str, str]] = None,
    cpus: Optional[Sequence[int]] = None,
) -> Tuple[subprocess.Popen, str, Path]:
    """The worker (on ``cpus``, if given), its base URL once it answers ``/healthz``, and where its profile goes."""
    port, profile = free_port(), scratch / f"profile-{time.monotonic_ns()}.txt"
    command = [
        str(python),
        "-m",
        "loadtest.studies._request_path",
        "--child",
        "--port",
        str(port),
        "--result",
        str(profile),
    ]
    child_env = {**_child_env(redis_url, token, "on", "on"), **(env or {})}
    worker = processes.start("worker", command, env=child_env, cpus=cpus)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(base + "/healthz"), 30, "the served worker")
    return worker, base, profile


def append_report(report: Path, title: str, heading: str, lines: List[str]) -> None:
    """A run's section (``heading`` with the time and commit, then ``lines``) at the end of ``report``; printed too."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    section = [f"## {heading}: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit.strip()}", ""]
    section += lines
    report.parent.mkdir(parents=True, exist_ok=True)
    existing = report.read_text() if report.exists() else f"# {title}\n"
    report.write_text(existing.rstrip("\n") + "\n\n" + "\n".join(section) + "\n")
    print("\n".join(section))
