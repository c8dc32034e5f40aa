"""A fresh server's first 10 s of PUTs against its warm PUTs, side by side (issue #60, "A cold worker's writes").

Each round starts a private Redis and a master with two workers (production
defaults: authorization and the access log on, the warm-up at its default),
waits for ``/healthz`` as a client would (``--all-ready``: and then for every
worker's warm-up to end, so no sibling's warm-up shares the cores), then runs wrk (64 connections, one
~200 B document, ``PUT``) for ``--seconds`` at once: the cold run; then the
same again: the warm run (its workers have written for ``--seconds`` by
then). It reports each run's p99, max and req/s and the cold p99 over the
warm p99, the workers' CPU time per PUT in each run (user and system, from
``/proc``: a compiling JIT's cost, which a loaded machine's scheduling
delays, the p99's noise, do not add to), and how long the server took from
its start to ``/healthz``.
``--tree DIR`` runs another checkout's code (the tree before a change; its
``.venv`` is this one's), alternating with this tree round by round.

Appends to ``loadtest/results/cold_writes.md``.

    .venv/bin/python -m loadtest.studies._cold_writes [--rounds 2] [--seconds 10] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from loadtest import _token
from loadtest._servers import PYPY, Processes, wait_until
from loadtest._token import ROOT
from loadtest.studies._request_path import DOCUMENT, DOCUMENT_PATH, WRK_SCRIPT

WORKERS = 2
REPORT = ROOT / "loadtest" / "results" / "cold_writes.md"


def workers_cpu(master: int) -> float:
    """The master's children's CPU time so far (user and system), in seconds."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    ticks = 0
    for pid in children:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def puts(base: str, token: str, body: Path, seconds: float, master: int) -> Dict[str, float]:
    """One wrk run of PUTs: p99 and max in ms, req/s, errors, and the workers' CPU per PUT in µs."""
    cpu = workers_cpu(master)
    load = ["wrk", "-t1", "-c64", f"-d{seconds:g}s", "-s", str(WRK_SCRIPT), f"-HAuthorization: Bearer {token}"]
    env = {**os.environ, "BENCH_METHOD": "PUT", "BENCH_BODY_FILE": str(body)}
    done = subprocess.run([*load, base + DOCUMENT_PATH], env=env, check=True, capture_output=True, text=True)
    cpu = workers_cpu(master) - cpu
    bench = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))[6:])
    return {
        "cpu_us": cpu * 1e6 / max(1, bench["requests"]),
        "p99": bench["p99_us"] / 1000,
        "max": bench["max_us"] / 1000,
        "rps": bench["requests"] / (bench["duration_us"] / 1e6),
        "errors": bench["status"] + bench["timeout"] + bench["read"] + bench["write"] + bench["connect"],
    }


def one_round(tree: Path, seconds: float, all_ready: bool) -> Dict[str, object]:
    with tempfile.TemporaryDirectory() as directory, Processes(Path(directory)) as processes:
        body = Path(directory) / "document.json"
        body.write_bytes(DOCUMENT)
        redis_url = processes.redis()
        token = _token.create(str(PYPY), redis_url, "cold")
        started = time.monotonic()
        settings = [("JETWAY_ACCESS_LOG", "on")]
        base = processes.jetway("jetway", PYPY, redis_url, WORKERS, settings=settings, cwd=tree)
        healthy = time.monotonic() - started
        log = Path(directory) / "jetway.log"
        if all_ready:
            wait_until(lambda: len(last_reports(log, tree)) >= WORKERS, 60, "every worker's warm-up")
        ready = time.monotonic() - started
        master = processes.named["jetway"].pid
        cold = puts(base, token, body, seconds, master)
        warm = puts(base, token, body, seconds, master)
        reports = last_reports(log, tree)
    return {"healthy": healthy, "ready": ready, "cold": cold, "warm": warm, "reports": reports}


def last_reports(log: Path, tree: Path) -> List[str]:
    """Each worker's warm-up so far: its start line, or in a tree from before issue #61 the report it serves after."""
    messages = [json.loads(line)["message"] for line in log.read_text().splitlines() if line.startswith("{")]
    serving = [message for message in messages if ") serving on :" in message]
    if serving:
        return serving
    last = "warm-up on Redis" if (tree / "api" / "warm_up_scratch.py").exists() else "warm-up: "
    return [message for message in messages if message.startswith(last)]


def row(name: str, result: Dict) -> str:
    cold, warm = result["cold"], result["warm"]
    return (
        f"| {name} | {result['healthy']:.1f} | {result['ready']:.1f} "
        f"| {cold['p99']:.2f} | {cold['max']:.1f} | {cold['rps']:,.0f} "
        f"| {warm['p99']:.2f} | {warm['max']:.1f} | {warm['rps']:,.0f} | {cold['p99'] / warm['p99']:.2f}x "
        f"| {cold['cpu_us']:.0f} | {warm['cpu_us']:.0f} | {cold['cpu_us'] / warm['cpu_us']:.2f}x "
        f"| {cold['errors'] + warm['errors']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--all-ready", action="store_true", help="measure once every worker has warmed up")
    parser.add_argument("--tree", type=Path, help="another checkout to run beside this one (the code before)")
    args = parser.parse_args()
    trees = [("this tree", ROOT)] + ([(f"tree {args.tree}", args.tree.resolve())] if args.tree else [])
    rows: List[str] = []
    reports: List[str] = []
    for number in range(args.rounds):
        for name, tree in trees if number % 2 == 0 else trees[::-1]:
            result = one_round(tree, args.seconds, args.all_ready)
            print(row(f"{name}, round {number + 1}", result), flush=True)
            rows.append(row(f"{name}, round {number + 1}", result))
            reports += [f"- {name}, round {number + 1}: " + "; ".join(result["reports"])]
    with REPORT.open("a") as out:
        out.write(
            f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}\n\n"
            f"`.venv/bin/python -m loadtest.studies._cold_writes --rounds {args.rounds} --seconds {args.seconds:g}"
            f"{' --all-ready' if args.all_ready else ''}{f' --tree {args.tree}' if args.tree else ''}`\n\n"
            "| server | to /healthz, s | measured from, s | first PUTs p99, ms | max | req/s "
            "| warm PUTs p99, ms | max | req/s "
            "| cold p99 / warm | CPU µs/PUT cold | warm | cold / warm | errors |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
            + "\n".join(rows)
            + "\n\nEach worker's last warm-up report:\n\n"
            + "\n".join(reports)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
