"""Where the server's memory goes: each process's resident memory idle and under wrk (issue #60).

Per tree (``--tree DIR``, repeatable; default this checkout): a private
Redis and ``python -m api serve --workers 2`` (the warm-up on, authorization
and the access log off), then each process's (master, workers) memory from
/proc: idle ``--settle`` seconds after the workers serve, and the peak seen
every half second while wrk's 64 connections GET a ~200 B document for
``--seconds``, then PUT it for ``--seconds``. RSS is what ``ps`` shows; PSS
shares a page among the processes that map it; USS is the process's own
pages. The workers are exec'd by the master, not forked, so they share only
the interpreter's and libraries' file pages. wrk's requests per second are
reported beside each tree's figures, so a memory cut that costs speed shows.

    .venv/bin/python -m loadtest.studies._memory --tree /tmp/before --tree . --seconds 10

Writes loadtest/results/memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

from loadtest._servers import ROOT, Processes

WRK_SCRIPT = ROOT / "loadtest" / "bench" / "wrk.lua"
DOCUMENT = b'{"id":"small","name":"Ada Lovelace","email":"ada@example.com","tags":["math","engines"],"score":97.5}'
KINDS = ("rss", "pss", "uss", "hwm")


def memory_mb(pid: int) -> Dict[str, float]:
    """RSS, PSS and USS of ``pid`` in MiB (smaps_rollup), and its RSS's high-water mark (VmHWM)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    own = fields["Private_Clean"] + fields["Private_Dirty"]
    status = Path(f"/proc/{pid}/status").read_text()
    high = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return {"rss": fields["Rss"] / 1024, "pss": fields["Pss"] / 1024, "uss": own / 1024, "hwm": high / 1024}


def processes_of(master: int) -> Dict[str, int]:
    children = sorted(int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split())
    return {"master": master, **{f"worker {n + 1}": pid for n, pid in enumerate(children)}}


def sample(master: int) -> Dict[str, Dict[str, float]]:
    return {name: memory_mb(pid) for name, pid in processes_of(master).items()}


def peak(into: Dict[str, Dict[str, float]], seen: Dict[str, Dict[str, float]]) -> None:
    for name, figures in seen.items():
        held = into.setdefault(name, dict.fromkeys(KINDS, 0.0))
        for kind in KINDS:
            held[kind] = max(held[kind], figures[kind])


def load(base: str, master: int, method: str, seconds: float, body: Path) -> tuple:
    """wrk for ``seconds``; the peak memory per process meanwhile and wrk's requests per second."""
    env = {**os.environ, "BENCH_METHOD": method, "BENCH_BODY_FILE": str(body)}
    command = ["wrk", "-t1", "-c64", f"-d{seconds:g}s", "-s", str(WRK_SCRIPT), f"{base}/v1/bench/small"]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    peaks: Dict[str, Dict[str, float]] = {}
    try:
        while run.poll() is None:
            peak(peaks, sample(master))
            time.sleep(0.5)
    finally:
        if run.poll() is None:  # a sample failed: wrk is this study's to stop
            run.kill()
            run.wait()
    out = run.stdout.read() if run.stdout else ""
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("BENCH "))[6:])
    return peaks, summary["requests"] / (summary["duration_us"] / 1e6)


def measure(processes: Processes, tree: Path, index: int, args: argparse.Namespace) -> Dict[str, object]:
    redis_url = processes.redis(name=f"redis{index}")
    name = f"jetway{index}"
    settings = [("JETWAY_AUTH", "off"), *(setting.split("=", 1) for setting in args.setting)]
    base = processes.jetway(name, ROOT / ".venv/bin/python", redis_url, 2, settings=settings, cwd=tree)
    master = processes.named[name].pid
    body = processes.directory / "small.json"
    body.write_bytes(DOCUMENT)
    put = urllib.request.Request(f"{base}/v1/bench/small", DOCUMENT, {"Content-Type": "application/json"}, method="PUT")
    urllib.request.urlopen(put, timeout=10).close()
    time.sleep(args.settle)
    idle = sample(master)
    get_peak, get_rps = load(base, master, "GET", args.seconds, body)
    put_peak, put_rps = load(base, master, "PUT", args.seconds, body)
    loaded: Dict[str, Dict[str, float]] = {}
    peak(loaded, get_peak)
    peak(loaded, put_peak)
    after = sample(master)
    processes.stop(processes.named[name])
    return {"idle": idle, "load": loaded, "after": after, "get_rps": get_rps, "put_rps": put_rps}


def table(tree: Path, result: Dict[str, object]) -> List[str]:
    header = "| process | idle RSS | PSS | USS | peak under load: RSS | PSS | USS | VmHWM after |"
    lines = [f"### {tree}", "", header]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    idle = result["idle"]
    columns = [("idle", kind) for kind in KINDS[:3]] + [("load", kind) for kind in KINDS[:3]] + [("after", "hwm")]
    totals = [0.0] * len(columns)
    for name in idle:  # type: ignore[union-attr]
        row = [result[when][name][kind] for when, kind in columns]  # type: ignore[index]
        totals = [total + figure for total, figure in zip(totals, row)]
        lines.append(f"| {name} | " + " | ".join(f"{figure:.0f}" for figure in row) + " |")
    lines.append("| all (sum) | " + " | ".join(f"{total:.0f}" for total in totals) + " |")
    lines += ["", f"wrk: GET {result['get_rps']:,.0f} req/s, PUT {result['put_rps']:,.0f} req/s", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to run (more than one to compare)")
    parser.add_argument("--seconds", type=float, default=10.0, help="of each wrk run (GET, then PUT)")
    parser.add_argument("--setting", action="append", default=[], help="NAME=VALUE in every server's environment")
    parser.add_argument("--settle", type=float, default=5.0, help="after the workers serve, before the idle figure")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in (args.tree or [ROOT])]
    options = [*(f"--tree {tree}" for tree in trees), *(f"--setting {s}" for s in args.setting)]
    options.append(f"--seconds {args.seconds:g}")
    command = " ".join(["python -m loadtest.studies._memory", *options])
    lines = ["# Each process's memory, idle and under wrk (MiB)", "", f"`{command}`", ""]
    with tempfile.TemporaryDirectory() as scratch, Processes(Path(scratch)) as processes:
        for index, tree in enumerate(trees):
            lines += table(tree, measure(processes, tree, index, args))
    out = ROOT / "loadtest" / "results" / "memory.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
