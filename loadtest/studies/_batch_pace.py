"""Whether a batch's writes go at Redis's pace: 100 PUTs in one batch against 100 single PUTs.

One Jetway worker (production defaults, access log on) and a private Redis
on a unix socket. On one keep-alive connection, ``--rounds`` rounds, each
of 100 single ``PUT``s of ~200 B documents and one ``POST /v1/_batch`` of
100 such PUTs (interleaved, so both meet the same machine); documents/s of
each, and the script calls Redis made for one batch, its time in them and
the commands they ran (``INFO commandstats``). Then the worker's RSS before and after ``--batches``
batches of 1,000 mixed operations (``loadtest.studies._batch_memory``'s), and the
store's ceiling: ``redis-benchmark -P 100 -t hset`` on the same Redis.
Writes ``loadtest/results/batch_pace.md``.

    .venv/bin/python -m loadtest.studies._batch_pace [--rounds 20] [--warm 1000] [--batches 20] [--healthz 20]

``--healthz SECONDS``: then ``/healthz``'s wait, probed every 20 ms on a
connection of its own while another sends 1,000-op batches back to back.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

from loadtest import _data, _token
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._batch_memory import mixed_batch, rss_mb
from loadtest.studies._served import append_report, serve_one

REPORT = ROOT / "loadtest" / "results" / "batch_pace.md"
DOCUMENTS = 100
SIZE = 200


class Client:
    """One keep-alive connection to the worker."""

    def __init__(self, base: str, headers: Dict[str, str]) -> None:
        parts = urlsplit(base)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.headers = headers

    def send(self, method: str, path: str, body: bytes) -> Tuple[int, bytes]:
        self.connection.request(method, path, body, {**self.headers, "Content-Type": "application/json"})
        response = self.connection.getresponse()
        return response.status, response.read()


def singles(client: Client, round_number: int) -> float:
    """Seconds for 100 single PUTs, one after another."""
    bodies = [(f"s{n}", _data.document(f"s{n}", SIZE, round_number)) for n in range(DOCUMENTS)]
    started = time.perf_counter()
    for doc_id, body in bodies:
        status, answer = client.send("PUT", f"/v1/pace/{doc_id}", body)
        if status not in (200, 201):
            raise RuntimeError(f"PUT {doc_id}: {status} {answer[:200]!r}")
    return time.perf_counter() - started


def batch_body(number: int) -> bytes:
    documents = [(f"b{n}", json.loads(_data.document(f"b{n}", SIZE, number))) for n in range(DOCUMENTS)]
    operations = [{"op": "put", "collection": "pace", "id": doc_id, "document": value} for doc_id, value in documents]
    return json.dumps({"operations": operations}).encode()


def batch(client: Client, round_number: int) -> float:
    """Seconds for one batch of 100 PUTs."""
    body = batch_body(round_number)
    started = time.perf_counter()
    status, answer = client.send("POST", "/v1/_batch", body)
    elapsed = time.perf_counter() - started
    statuses = {result["status"] for result in json.loads(answer)["results"]} if status == 200 else {status}
    if not statuses <= {200, 201}:
        raise RuntimeError(f"batch: statuses {sorted(statuses)} {answer[:300]!r}")
    return elapsed


def redis_cli(socket: str, *command: str) -> str:
    return subprocess.run(["redis-cli", "-s", socket, *command], capture_output=True, text=True, check=True).stdout


def script_calls(socket: str) -> Tuple[int, int]:
    """EVALSHA and EVAL calls Redis has counted so far, and the microseconds it spent in them."""
    stats = redis_cli(socket, "INFO", "commandstats")
    found = re.findall(r"cmdstat_eval(?:sha)?:calls=(\d+),usec=(\d+)", stats)
    return sum(int(calls) for calls, _ in found), sum(int(usec) for _, usec in found)


def commands_run(socket: str) -> int:
    """Commands Redis has counted but script calls and ``INFO``: mostly those the scripts ran (``redis.call``)."""
    stats = redis_cli(socket, "INFO", "commandstats")
    found = re.findall(r"cmdstat_([a-z|]+):calls=(\d+)", stats)
    return sum(int(calls) for name, calls in found if name not in ("eval", "evalsha", "info"))


def ceiling(socket: str) -> float:
    """``redis-benchmark -P 100 -t hset``'s requests/s on the same Redis."""
    out = subprocess.run(
        ["redis-benchmark", "-s", socket, "-P", "100", "-t", "hset", "-n", "500000", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    return float(found[-1]) if found else float("nan")


def pace(client: Client, socket: str, rounds: int, warm: int) -> List[str]:
    # The JIT compiles both paths before anything is timed. A batch takes many more traces than a PUT: after
    # 30 batches one cost 4.2 ms of the worker's CPU, after 1,000 1.8 ms (100 PUTs of 200 B each, one worker).
    for number in range(warm):
        batch(client, number)
        if number % 10 == 0:
            singles(client, number)
    single_rates, batch_rates = [], []
    for number in range(rounds):
        single_rates.append(DOCUMENTS / singles(client, 100 + number))
        batch_rates.append(DOCUMENTS / batch(client, 100 + number))
    calls_before, usec_before = script_calls(socket)
    run_before = commands_run(socket)
    took = batch(client, 999)
    run = commands_run(socket) - run_before
    calls_after, usec_after = script_calls(socket)
    calls, usec = calls_after - calls_before, usec_after - usec_before
    ratios = [b / s for b, s in zip(batch_rates, single_rates)]
    return [
        "| | documents/s (median) | min | max |",
        "|---|---:|---:|---:|",
        _row("100 single PUTs", single_rates),
        _row("1 batch of 100 PUTs", batch_rates),
        f"| batch / single (per round) | {statistics.median(ratios):.1f}x | {min(ratios):.1f}x | {max(ratios):.1f}x |",
        "",
        f"Script calls Redis ran for one batch of 100 PUTs: {calls}, taking {usec / 1000:.2f} ms of Redis's time"
        f" (the whole batch, client to client: {took * 1000:.2f} ms); the commands it ran inside: {run}.",
    ]


def _row(name: str, rates: List[float]) -> str:
    return f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f} | {max(rates):,.0f} |"


def memory(client: Client, worker: int, batches: int, size: int) -> List[str]:
    for warm in range(5):  # "after the first few"
        client.send("POST", "/v1/_batch", mixed_batch(warm, size))
    time.sleep(1)
    before = rss_mb(worker)
    body_bytes, answer_bytes, peak = len(mixed_batch(0, size)), 0, before
    for number in range(10, 10 + batches):
        status, answer = client.send("POST", "/v1/_batch", mixed_batch(number, size))
        if status != 200:
            raise RuntimeError(f"mixed batch: {status} {answer[:300]!r}")
        answer_bytes = max(answer_bytes, len(answer))
        peak = max(peak, rss_mb(worker))
    own = (body_bytes + answer_bytes) / 2**20
    return [
        f"| worker RSS after 5 mixed batches of 1,000 ({size} B documents) | {before:.1f} MB |",
        f"| largest RSS over the next {batches} | {peak:.1f} MB |",
        f"| rise / the batch's bytes (body {body_bytes / 2**20:.2f} + answer {answer_bytes / 2**20:.2f} MiB) |"
        f" {(peak - before) / own:.1f}x |",
    ]


def healthz_behind(base: str, headers: Dict[str, str], seconds: float, size: int) -> List[str]:
    """``/healthz``'s wait on its own connection, every 20 ms, while another sends 1,000-op batches back to back."""
    bodies = [mixed_batch(number, size) for number in range(10)]
    loader, probe = Client(base, headers), Client(base, {})
    done = threading.Event()

    def load() -> None:
        number = 0
        while not done.is_set():
            loader.send("POST", "/v1/_batch", bodies[number % len(bodies)])
            number += 1

    thread = threading.Thread(target=load)
    thread.start()
    waits: List[float] = []
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            started = time.perf_counter()
            probe.send("GET", "/healthz", b"")
            waits.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)
    finally:
        done.set()
        thread.join()
    waits.sort()
    return [
        f"| /healthz behind 1,000-op batches ({len(waits)} probes) | median {statistics.median(waits):.1f} ms,"
        f" p99 {waits[int(len(waits) * 0.99)]:.1f} ms, max {waits[-1]:.1f} ms |"
    ]


def profile(python: Path, batches: int) -> int:
    """One worker as ``loadtest.studies._request_path --serve`` runs it; vmprof over ``batches`` batches of 100 PUTs."""
    with tempfile.TemporaryDirectory(prefix="jetway-batch-pace-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        token = _token.resolve(str(python), redis_url).token or ""
        worker, base, result = serve_one(processes, python, redis_url, token, Path(scratch))
        client = Client(base, {"Authorization": f"Bearer {token}"})
        for warm in range(200):
            batch(client, warm)
        worker.send_signal(signal.SIGUSR1)  # vmprof on
        for number in range(batches):
            batch(client, number)
        processes.stop(worker)
        print(result.read_text())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warm", type=int, default=1000, help="batches (and a tenth as many rounds of singles) first")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--size", type=int, default=1024, help="bytes of each document of the mixed batches")
    parser.add_argument("--label", default="", help="a name for this run in the report (before, after)")
    parser.add_argument("--healthz", type=float, default=0, help="seconds of /healthz probes behind mixed batches")
    parser.add_argument("--profile", type=int, default=0, help="vmprof over this many batches of 100 PUTs instead")
    args = parser.parse_args()
    stop_on_sigterm()
    python = Path(sys.executable)
    if args.profile:
        return profile(python, args.profile)
    with tempfile.TemporaryDirectory(prefix="jetway-batch-pace-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        socket = redis_url[len("unix://") :]
        base = processes.jetway("jetway", python, redis_url, 1, settings=(("JETWAY_ACCESS_LOG", "on"),))
        client = Client(base, _token.resolve(str(python), redis_url).headers())
        master = processes.named["jetway"].pid
        worker = int(Path(f"/proc/{master}/task/{master}/children").read_text().split()[0])
        lines = pace(client, socket, args.rounds, args.warm)
        lines += ["", "| memory | |", "|---|---:|", *memory(client, worker, args.batches, args.size)]
        if args.healthz:
            lines += healthz_behind(base, client.headers, args.healthz, args.size)
        lines += ["", f"Ceiling: `redis-benchmark -P 100 -t hset` on the same Redis: {ceiling(socket):,.0f} HSET/s."]
    command = (
        f"`python -m loadtest.studies._batch_pace --rounds {args.rounds} --warm {args.warm} --batches {args.batches}"
        f" --size {args.size}`"
    )
    append_report(REPORT, "Batches at Redis's pace", args.label or "run", [command, "", *lines])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
