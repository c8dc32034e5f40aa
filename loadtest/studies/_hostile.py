"""Hostile clients at full size, against a Jetway with production defaults.

``python -m loadtest.studies._hostile`` (after ``make setup``) starts a private Redis
and a master with its workers (authorization and access log on), then:

1. one client pipelines GETs of a 200 KB document for 5 s without reading
   a byte: how much the workers grew, and their CPU 2 s after it closed;
2. 1,000 connections each send all but the last byte of a 1 MB body: the
   workers' memory while they wait, how many were held and how many refused,
   and whether ordinary reads on other connections were answered meanwhile.

It writes ``loadtest/results/hostile.md``. Figures are this machine's, from
one run: compare runs side by side, not with another day's numbers.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import requests

from loadtest._servers import ROOT, Processes, free_port, http_ok, wait_until
from loadtest._token import create as make_token
from loadtest.studies._attacks import (
    answered,
    children,
    cpu_share,
    get_request,
    partial_body,
    pipeline_without_reading,
    rss_mb,
)

MB = 1000 * 1000
DOCUMENT = b'{"pad":"' + b"x" * (200 * 1024) + b'"}'
OUTPUT = ROOT / "loadtest" / "results" / "hostile.md"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the pipelining client sends")
    parser.add_argument("--bodies", type=int, default=1000, help="connections holding a partial body")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    _raise_open_files_limit()
    with tempfile.TemporaryDirectory(prefix="hostile-") as directory, Processes(Path(directory)) as processes:
        port, master, token = _start(processes, args.workers)
        headers = {"Authorization": f"Bearer {token}"}
        put = requests.put(
            f"http://127.0.0.1:{port}/v1/hostile/big",
            data=DOCUMENT,
            headers={**headers, "Content-Type": "application/json"},
            timeout=10,
        )
        put.raise_for_status()
        workers = children(master)
        rows = [_pipelining(port, token, workers, args.seconds), *_partial_bodies(port, headers, workers, args.bodies)]
    report = _report(rows, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report)
    print(report)
    return 0


def _start(processes: Processes, workers: int) -> Tuple[int, int, str]:
    redis_url = processes.redis()
    python = str(ROOT / ".venv" / "bin" / "python")
    token = make_token(python, redis_url, "hostile")
    port = free_port()
    command = [python, "-m", "api", "serve", "--port", str(port), "--workers", str(workers)]
    master = processes.start("jetway", command, env={"REDIS_URL": redis_url})
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 30, "jetway")
    time.sleep(1.0)  # let the workers settle before their memory is read
    return port, master.pid, token


def _pipelining(port: int, token: str, workers: List[int], seconds: float) -> Tuple[str, str]:
    before = sum(rss_mb(pid) for pid in workers)
    sock = pipeline_without_reading(port, get_request("/v1/hostile/big", token), seconds)
    grown = sum(rss_mb(pid) for pid in workers) - before
    sock.close()
    time.sleep(2.0)
    share = cpu_share(workers, 1.0)
    return (
        f"one client pipelines GETs of a 200 KB document for {seconds:g} s, never reading",
        f"workers +{grown:.0f} MB; 2 s after it closed: {share:.1%} of a core",
    )


def _partial_bodies(port: int, headers: dict, workers: List[int], count: int) -> List[Tuple[str, str]]:
    before = [rss_mb(pid) for pid in workers]
    held: List[socket.socket] = []
    refused = 0
    for n in range(count):
        sock = partial_body(port, f"/v1/hostile/b{n}", MB, MB - 1, headers["Authorization"].split()[1])
        answer = answered(sock, 0.05)
        if answer.startswith(b"HTTP/1.1 503"):
            refused += 1
            sock.close()
        else:
            held.append(sock)
    peak = [rss_mb(pid) for pid in workers]
    latencies = _reads_meanwhile(port, headers)
    for sock in held:
        sock.close()
    time.sleep(1.0)
    after = [rss_mb(pid) for pid in workers]
    worker_list = ", ".join(f"{b:.0f} → {p:.0f} → {a:.0f}" for b, p, a in zip(before, peak, after))
    return [
        (
            f"{count:,} connections each send 1 MB of a 1 MB body but the last byte",
            f"{len(held)} held, {refused} refused with 503;"
            f" worker RSS MB before → holding → after close: {worker_list}",
        ),
        (
            "meanwhile, 50 GETs of the 200 KB document on another connection",
            latencies,
        ),
    ]


def _reads_meanwhile(port: int, headers: dict) -> str:
    timings: List[float] = []
    statuses: List[int] = []
    with requests.Session() as session:
        for _ in range(50):
            started = time.perf_counter()
            response = session.get(f"http://127.0.0.1:{port}/v1/hostile/big", headers=headers, timeout=10)
            timings.append((time.perf_counter() - started) * 1000)
            statuses.append(response.status_code)
    answered_ok = statuses.count(200)
    return f"{answered_ok}/50 answered 200; median {statistics.median(timings):.1f} ms, max {max(timings):.1f} ms"


def _report(rows: List[Tuple[str, str]], args: argparse.Namespace) -> str:
    lines = [
        "# Hostile clients",
        "",
        f"`python -m loadtest.studies._hostile --workers {args.workers} --seconds {args.seconds:g}"
        f" --bodies {args.bodies}`"
        f" at {time.strftime('%Y-%m-%d %H:%M')}, on {os.cpu_count()} cores; production defaults"
        " (authorization and access log on, JETWAY_BODY_BUDGET and JETWAY_SEND_TIMEOUT at their defaults).",
        "",
        "| attack | what it cost |",
        "|---|---|",
        *(f"| {attack} | {cost} |" for attack, cost in rows),
        "",
    ]
    return "\n".join(lines)


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


if __name__ == "__main__":
    sys.exit(main())
