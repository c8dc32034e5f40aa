"""Jetway on one Redis and on a 3-master Redis Cluster, side by side under wrk.

``.venv/bin/python -m loadtest.studies._topologies [--seconds 10] [--rounds 2]`` (the
leading underscore keeps ``locust -f loadtest/`` from importing it).

Starts a redis-server on TCP, a 3-master cluster (``tests.multinode``), and
a Jetway (PyPy, ``--workers``, authorization off: the Redis path is what is
compared) on each; seeds 1000 documents of ~200 B in each; warms both up
(PyPy's JIT); then measures every case on both, alternating which goes
first, ``rounds`` times. Cases: GET of a random document, PUT over a random
one, a multi-get of 20 random ids (spans every node of the cluster), a list
page of 100 (16 index shards on every node). wrk, the workers and the
Redis servers share the machine's cores, so on a small machine this shows
what the cluster layer costs, not what more Redis capacity buys.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

import requests

from tests.multinode import ClusterServers, RedisProcess, data_args
from tests.support import JetwayServer, free_port

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "topologies.lua"
DOCS = 1000
CASES = ("get", "put", "many", "page")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._topologies", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load per server before measuring")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        print("wrk is not installed (make loadtest-packages)")
        return 2
    home = Path(tempfile.mkdtemp(prefix="jetway-topologies-"))
    port = free_port()
    single = RedisProcess(home / "single", port, data_args(home / "single", port))
    cluster = ClusterServers(home / "cluster")
    servers: List[JetwayServer] = []
    try:
        single.start()
        cluster.start()
        env = {"JETWAY_AUTH": "off"}
        urls = {"one Redis": f"redis://127.0.0.1:{port}/0", "3-master cluster": cluster.url}
        gateways: Dict[str, JetwayServer] = {}
        for label, url in urls.items():
            gateway = JetwayServer(url, home / f"{label.replace(' ', '-')}.log", env=env)
            servers.append(gateway.start(["--workers", str(args.workers)]))
            gateways[label] = gateway
            _seed(gateway)
        for gateway in gateways.values():
            for case in CASES:
                _wrk(gateway, case, args.warmup / len(CASES), args.connections)
        results: Dict[str, Dict[str, List[float]]] = {label: {case: [] for case in CASES} for label in gateways}
        for round_number in range(args.rounds):
            order = list(gateways) if round_number % 2 == 0 else list(reversed(gateways))
            for case in CASES:
                for label in order:
                    run = _wrk(gateways[label], case, args.seconds, args.connections)
                    results[label][case].append(run["rps"])
                    print(
                        f"round {round_number + 1} {case:5} {label:17} {run['rps']:8.0f}/s  p99 {run['p99_ms']:.1f} ms"
                    )
        _report(results, args)
    finally:
        for server in servers:
            server.stop()
        cluster.stop()
        single.stop()
    return 0


def _seed(gateway: JetwayServer) -> None:
    with requests.Session() as session:
        for n in range(1, DOCS + 1):
            body = json.dumps({"id": f"d{n}", "name": "a seeded record", "pad": "x" * 140})
            response = session.put(
                gateway.url(f"/v1/bench/d{n}"), data=body, headers={"Content-Type": "application/json"}
            )
            response.raise_for_status()


def _wrk(gateway: JetwayServer, case: str, seconds: float, connections: int) -> Dict[str, float]:
    duration = f"{max(1, round(seconds))}s"  # wrk takes whole seconds only
    command = ["wrk", "-t", "1", "-c", str(connections), "-d", duration, "-s", str(SCRIPT), gateway.base]
    env = {**os.environ, "TOPO_CASE": case, "TOPO_DOCS": str(DOCS)}
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("TOPO "))
    summary = json.loads(line[len("TOPO ") :])
    if summary["errors"] or summary["non2xx"]:
        raise RuntimeError(f"{case} on {gateway.base}: {summary}")
    return {"rps": summary["requests"] / (summary["duration_us"] / 1e6), "p99_ms": summary["p99_us"] / 1000}


def _report(results: Dict[str, Dict[str, List[float]]], args: argparse.Namespace) -> None:
    labels = list(results)
    print(
        f"\nrequests/s, median (lowest-highest) of {args.rounds} rounds of {args.seconds:.0f} s, "
        f"wrk -c {args.connections}, {args.workers} PyPy workers each, {os.cpu_count()} cores shared by everything"
    )
    print(f"{'case':6}" + "".join(f"{label:>26}" for label in labels) + f"{'cluster/one':>13}")
    for case in CASES:
        runs = [results[label][case] for label in labels]
        cells = [f"{statistics.median(r):.0f} ({min(r):.0f}-{max(r):.0f})" for r in runs]
        ratio = statistics.median(runs[1]) / statistics.median(runs[0])
        print(f"{case:6}" + "".join(f"{cell:>26}" for cell in cells) + f"{ratio:13.2f}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
