"""What the hot cache's bound on its invalidations' lag costs under load: reads sent to Redis, throughput.

``python -m loadtest.studies._hot_cache_lag --rounds 2`` (after ``make setup``)
starts a private Redis and, per round and per setting, a master with 2
workers (the warm-up on, authorization off, the hot cache at its default
size) with ``JETWAY_HOT_CACHE_MAX_LAG_MS`` at its default and out of reach
(600000: no bound, as before it), puts wrk's 64 connections on one cached
document for 5 s, then for ``--seconds``, and reports wrk's requests per
second and, from ``/metrics``, the hits and the reads of a held entry that
went to Redis because the last confirmed invalidation was older than the
bound (``lagging``). Settings alternate, so the machine's drift falls on
both. Figures are this machine's: compare runs side by side.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import requests

from tests.support import JetwayServer, RedisServer

SETTINGS = {"default (50 ms)": {}, "out of reach": {"JETWAY_HOT_CACHE_MAX_LAG_MS": "600000"}}


def figures(server: JetwayServer) -> Dict[str, float]:
    text = requests.get(server.url("/metrics"), timeout=10).text
    found = {}
    for name in ("hits", "misses", "lagging"):
        match = re.search(rf"^jetway_hot_cache_{name}_total (\S+)$", text, re.M)
        found[name] = float(match.group(1)) if match else 0.0
    return found


def one_round(redis_url: str, home: Path, env: Dict[str, str], seconds: float) -> str:
    server = JetwayServer(redis_url, home / "jetway.log", env={"JETWAY_WARM_UP": "12000", **env})
    server.start(["--workers", "2"])
    try:
        url = server.url("/v1/bench/a")
        requests.put(url, data=b'{"name":"ada"}', headers={"Content-Type": "application/json"}, timeout=10)
        subprocess.run(["wrk", "-t2", "-c64", "-d5s", url], capture_output=True, check=True)
        time.sleep(1.5)  # the workers' figures reach /metrics once a second
        before = figures(server)
        run = subprocess.run(["wrk", "-t2", "-c64", f"-d{seconds:g}s", url], capture_output=True, text=True)
        time.sleep(1.5)
        spent = {name: value - before[name] for name, value in figures(server).items()}
    finally:
        server.stop()
    rate = re.search(r"Requests/sec:\s+(\S+)", run.stdout)
    share = 100 * spent["lagging"] / max(1.0, spent["hits"] + spent["lagging"])
    return (
        f"{float(rate.group(1)) if rate else 0:,.0f} req/s; hits {spent['hits']:,.0f}, "
        f"lagging {spent['lagging']:,.0f} ({share:.2f}% of reads of a held entry)"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._hot_cache_lag")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    lines = []
    with tempfile.TemporaryDirectory() as directory:
        redis_server = RedisServer(Path(directory) / "redis").start()
        try:
            for round_ in range(1, args.rounds + 1):
                for name, env in SETTINGS.items():
                    line = f"round {round_}, bound {name}: " + one_round(
                        redis_server.url, Path(directory), env, args.seconds
                    )
                    print(line, flush=True)
                    lines.append(line)
        finally:
            redis_server.stop()
    output = Path("loadtest/results/hot_cache_lag.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(f"- {line}" for line in lines) + "\n")
    print(f"written to {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
