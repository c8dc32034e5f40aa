"""What an idle worker spends: its CPU while nobody sends it anything (issue #56, the hot cache's heartbeat).

One worker per tree (production defaults but the warm-up, which would only
add its own seconds), each on a private Redis, started side by side and left
alone; after a settling spell, each worker's CPU (utime + stime from /proc)
over ``--seconds``, in turns, ``--rounds`` times. With ``--tree DIR`` twice
the two checkouts are compared (before and after a change):

    .venv/bin/python -m loadtest.studies._idle_cpu --tree /tmp/old --tree . --rounds 3

Writes loadtest/results/idle_cpu.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from loadtest._servers import ROOT, Processes

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE = 15.0  # past the hot cache's IDLE_AFTER and the start's own work


def worker_cpu(master_pid: int) -> float:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    fields = Path(f"/proc/{children[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to run (twice to compare)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in (args.tree or [ROOT])]
    shares: Dict[int, List[float]] = {index: [] for index in range(len(trees))}
    with tempfile.TemporaryDirectory() as scratch, Processes(Path(scratch)) as processes:
        masters = []
        for index, tree in enumerate(trees):
            redis_url = processes.redis(name=f"redis{index}")
            processes.jetway(
                f"jetway{index}", ROOT / ".venv/bin/python", redis_url, 1, settings=[("JETWAY_WARM_UP", "0")], cwd=tree
            )
            masters.append(processes.named[f"jetway{index}"].pid)
        time.sleep(SETTLE)
        for _ in range(args.rounds):
            for index, master in enumerate(masters):
                before = worker_cpu(master)
                time.sleep(args.seconds)
                shares[index].append((worker_cpu(master) - before) / args.seconds)
    lines = [
        "# An idle worker's CPU",
        "",
        f"`{' '.join(['python -m loadtest.studies._idle_cpu', *(f'--tree {t}' for t in trees)])}"
        f" --rounds {args.rounds} --seconds {args.seconds:g}`",
        "",
        "| tree | share of a core, each round | median |",
        "| --- | --- | --- |",
    ]
    for index, tree in enumerate(trees):
        rounds = sorted(shares[index])
        lines.append(
            f"| {tree} | {', '.join(f'{share:.2%}' for share in shares[index])} | {rounds[len(rounds) // 2]:.2%} |"
        )
    report = ROOT / "loadtest/results/idle_cpu.md"
    report.parent.mkdir(exist_ok=True)
    report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
