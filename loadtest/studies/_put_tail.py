"""Where a slow PUT's time goes: one worker under wrk's PUTs, its collector's pauses and Redis's, side by side.

One served worker (``loadtest.studies._request_path``'s child: production defaults,
authorization and the access log on) per variant, each with PyPy's GC log
(``PYPYLOG=gc-minor,gc-collect-step``), a private Redis with its latency
monitor on (1 ms) and slow log at 1 ms; wrk PUTs one ~200 B document with 64
connections, 10 s to warm the JIT, then ``--seconds`` measured. For the
measured run: req/s, latency percentiles, and the pauses the worker's
collector made in it (minor collections and major steps: count, median,
p99, max, their share of the run), and Redis's latency events and slow
commands. Variants: production defaults, the change feed off, the
collector's increment step at 2 MB, the hot cache off; and two befores,
the causes of the tail that were cut: PyPy's own increment step (twice the
8 MB nursery: 16 MB, before ``api.master`` set 4 MB) and a cold JIT (no
warm-up at all: the first ``--seconds`` of PUTs measured, as ``bench.sh``
measured them before each worker warmed itself up, ``api.warm_up``).

Writes ``loadtest/results/put_tail.md`` (appended).

    .venv/bin/python -m loadtest.studies._put_tail [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

from loadtest import _token
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._batch_pace import redis_cli
from loadtest.studies._request_path import DOCUMENT, DOCUMENT_PATH, WRK_SCRIPT
from loadtest.studies._served import append_report, serve_one

REPORT = ROOT / "loadtest" / "results" / "put_tail.md"
# A variant's name, its worker's environment, and whether wrk warms the JIT up first.
VARIANTS: List[Tuple[str, Dict[str, str], bool]] = [
    ("defaults", {}, True),
    ("feed off", {"JETWAY_FEED": "off"}, True),
    ("GC step 2 MB", {"PYPY_GC_INCREMENT_STEP": "2MB"}, True),
    ("hot cache off", {"JETWAY_HOT_CACHE_BYTES": "0"}, True),
    ("before: PyPy's GC step (16 MB)", {"PYPY_GC_INCREMENT_STEP": "16MB"}, True),
    ("before: cold JIT", {}, False),
]
_EVENT = re.compile(rb"^\[([0-9a-f]+)\] (\{)?(gc-minor|gc-collect-step)(\})?$", re.M)


def pauses(log: bytes) -> Tuple[Dict[str, List[int]], int, int]:
    """Each kind's pause durations in ticks, and the first and last tick the log names."""
    found: Dict[str, List[int]] = {"gc-minor": [], "gc-collect-step": []}
    opened: Dict[str, int] = {}
    first = last = 0
    for match in _EVENT.finditer(log):
        tick, start, kind, end = int(match.group(1), 16), match.group(2), match.group(3).decode(), match.group(4)
        first, last = first or tick, tick
        if start:
            opened[kind] = tick
        elif end and kind in opened:
            found[kind].append(tick - opened.pop(kind))
    return found, first, last


def _ms(ticks: List[int], per_ms: float, at: float) -> float:
    ordered = sorted(ticks)
    return ordered[min(len(ordered) - 1, int(len(ordered) * at))] / per_ms if ordered else 0.0


def measure(
    processes: Processes,
    python: Path,
    redis_url: str,
    token: str,
    env: Dict[str, str],
    seconds: float,
    scratch: Path,
    warm: bool = True,
) -> Dict:
    gc_log = scratch / f"gc-{time.monotonic_ns()}.log"
    env = {**env, "PYPYLOG": f"gc-minor,gc-collect-step:{gc_log}"}
    worker, base, _ = serve_one(processes, python, redis_url, token, scratch, env)
    socket_path = redis_url[len("unix://") :]
    try:
        body = scratch / "document.json"
        body.write_bytes(DOCUMENT)
        load = ["wrk", "-t1", "-c64", "-s", str(WRK_SCRIPT), f"-HAuthorization: Bearer {token}", base + DOCUMENT_PATH]
        load_env = {**os.environ, "BENCH_METHOD": "PUT", "BENCH_BODY_FILE": str(body)}
        if warm:
            subprocess.run([*load, "-d10s"], env=load_env, check=True, stdout=subprocess.DEVNULL)  # the JIT's warm-up
        redis_cli(socket_path, "CONFIG", "SET", "latency-monitor-threshold", "1")
        redis_cli(socket_path, "CONFIG", "SET", "slowlog-log-slower-than", "1000")
        redis_cli(socket_path, "LATENCY", "RESET")
        redis_cli(socket_path, "SLOWLOG", "RESET")
        offset, started = gc_log.stat().st_size, time.monotonic()
        done = subprocess.run([*load, f"-d{seconds:g}s"], env=load_env, check=True, stdout=subprocess.PIPE, text=True)
        wall = time.monotonic() - started
        bench = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))[6:])
        with gc_log.open("rb") as file:
            file.seek(offset)
            found, first, last = pauses(file.read())
        latency = redis_cli(socket_path, "LATENCY", "LATEST").split()
        slow = int(redis_cli(socket_path, "SLOWLOG", "LEN").strip() or 0)
        slowest = slow_commands(socket_path)
    finally:
        processes.stop(worker)
    per_ms = (last - first) / (wall * 1000) if last > first else 1.0  # the log's ticks are the CPU's clock
    minor, major = found["gc-minor"], found["gc-collect-step"]
    return {
        "rps": bench["requests"] / (bench["duration_us"] / 1e6),
        "p50": bench["p50_us"] / 1000,
        "p99": bench["p99_us"] / 1000,
        "max": bench["max_us"] / 1000,
        "errors": bench["status"] + bench["timeout"] + bench["read"] + bench["write"] + bench["connect"],
        "minor": (len(minor), _ms(minor, per_ms, 0.5), _ms(minor, per_ms, 0.99), _ms(minor, per_ms, 1.0)),
        "major": (len(major), _ms(major, per_ms, 0.5), _ms(major, per_ms, 0.99), _ms(major, per_ms, 1.0)),
        "gc_share": (sum(minor) + sum(major)) / per_ms / (wall * 1000),
        "redis_latency_events": " ".join(latency) or "none",
        "redis_slow": slow,
        "redis_slowest": slowest,
    }


def slow_commands(socket_path: str) -> str:
    """The slow log's commands by name, each with its count and longest time (µs)."""
    entries = subprocess.run(
        ["redis-cli", "-s", socket_path, "--json", "SLOWLOG", "GET", "128"], capture_output=True, text=True, check=True
    ).stdout
    found: Dict[str, List[int]] = {}
    for entry in json.loads(entries or "[]"):
        name = entry[3][0] if entry[3] else "?"
        found.setdefault(name, []).append(int(entry[2]))
    return ", ".join(f"{name} {len(times)}x ≤ {max(times)} µs" for name, times in found.items()) or "none"


def row(name: str, result: Dict) -> str:
    minor, major = result["minor"], result["major"]
    return (
        f"| {name} | {result['rps']:,.0f} | {result['p50']:.2f} | {result['p99']:.2f} | {result['max']:.1f} "
        f"| {minor[0]}: {minor[1]:.2f} / {minor[2]:.2f} / {minor[3]:.2f} "
        f"| {major[0]}: {major[1]:.2f} / {major[2]:.2f} / {major[3]:.2f} | {result['gc_share']:.1%} "
        f"| {result['redis_slow']}: {result['redis_slowest']} | {result['redis_latency_events']} | {result['errors']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="each variant this many times, interleaved")
    args = parser.parse_args()
    stop_on_sigterm()
    python = Path(sys.executable)
    lines = [
        "| variant | req/s | p50 ms | p99 ms | max ms | minor collections: n, median / p99 / max ms "
        "| major steps: n, median / p99 / max ms | time in GC | Redis slow log (≥ 1 ms) | Redis latency events "
        "| errors |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|---|---:|",
    ]
    medians: Dict[str, List[float]] = {}
    with tempfile.TemporaryDirectory(prefix="jetway-put-tail-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        token = _token.resolve(str(python), redis_url).token or ""
        for round_number in range(args.rounds):
            for name, env, warm in VARIANTS if round_number % 2 == 0 else reversed(VARIANTS):
                result = measure(processes, python, redis_url, token, env, args.seconds, Path(scratch), warm)
                lines.append(row(f"{name} (round {round_number + 1})", result))
                medians.setdefault(name, []).append(result["p99"])
                print(lines[-1], flush=True)
    heading = [
        f"`python -m loadtest.studies._put_tail --seconds {args.seconds:g} --rounds {args.rounds}`:"
        " one worker, wrk -c64,"
        " a ~200 B PUT of one document; p99 medians: "
        + ", ".join(f"{name} {statistics.median(values):.2f} ms" for name, values in medians.items()),
        "",
    ]
    append_report(REPORT, "Where a slow PUT's time goes", "run", heading + lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
