"""The hot cache's two measured promises: how stale a worker can be, and what memory it takes.

``python -m loadtest.studies._hot_cache staleness`` (after ``make setup``) starts a
private Redis and a master with 2 workers (production defaults: authorization
on with an unrated token, access log on, the hot cache at its default bound),
puts wrk's 64 connections on one document, and then, ``--writes`` times:
PUTs a new version of that document and, from the moment the 2xx arrives,
reads it on one connection to each worker (the workers are told apart by
their request-id prefix) until both serve the new ETag. A write's window is
the time from its 2xx to the sending of the first read, on the slower of
the two workers, that got the new ETag (0 when the first read already did).
It also counts reads that got an older version than one the same worker
had served before (never allowed), and reads whose body does not belong to
their ETag.

``python -m loadtest.studies._hot_cache memory`` seeds ``--docs`` documents of
``--size`` bytes straight into Redis, then reads them at random with wrk
(64 connections) for ``--seconds`` on 2 workers, with the cache off and then
on (production defaults otherwise), and reports each worker's resident
memory against the bound + 150 MB.

Each writes ``loadtest/results/hot_cache_<what>.md``. Figures are this
machine's, from one run: compare runs side by side, not with another day's.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from loadtest._servers import PYPY, ROOT, Processes
from loadtest._token import create as make_token

OUTPUT = ROOT / "loadtest" / "results"
WRK_LUA = ROOT / "loadtest" / "bench" / "wrk.lua"
DEFAULT_BOUND = 64 * 1024 * 1024
MEMORY_TARGET_MARGIN_MB = 150
PATH = "/v1/stale/doc"


# The path of the seeded documents, but for their number.
SEEDED_PREFIX = "/v1/mem/d"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._hot_cache", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    stale = commands.add_parser("staleness", help="the window from a PUT's 2xx to both workers serving it")
    stale.add_argument("--writes", type=int, default=2000)
    stale.add_argument("--warmup", type=float, default=15.0, help="seconds of read load before the first write")
    memory = commands.add_parser("memory", help="workers' memory after reads over many documents")
    memory.add_argument("--docs", type=int, default=100_000)
    memory.add_argument("--size", type=int, default=1024)
    memory.add_argument("--seconds", type=float, default=60.0)
    memory.add_argument("--bound", type=int, default=DEFAULT_BOUND, help="JETWAY_HOT_CACHE_BYTES when on")
    for command in (stale, memory):
        command.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    report = staleness(args) if args.command == "staleness" else memory_use(args)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    output = OUTPUT / f"hot_cache_{args.command}.md"
    output.write_text(report)
    print(report)
    print(f"written to {output}")
    return 0


# --- staleness ------------------------------------------------------------------


class Probe:
    """A keep-alive connection that stays on one worker."""

    def __init__(self, port: int, headers: Dict[str, str]) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.headers = headers
        self.worker = ""
        self.highest = -1  # the newest version this worker has served to this probe

    def send(self) -> float:
        """Send a GET; when it was sent."""
        sent = time.perf_counter()
        self.connection.request("GET", PATH, headers=self.headers)
        return sent

    def receive(self) -> Tuple[str, bytes]:
        """The ETag and the body of the GET sent."""
        response = self.connection.getresponse()
        body = response.read()
        self.worker = (response.getheader("X-Request-ID") or "")[:16]
        return response.getheader("ETag") or "", body


def staleness(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="hot-stale-") as directory, Processes(Path(directory)) as processes:
        redis_url = processes.redis()
        token = make_token(str(PYPY), redis_url, "stale")
        headers = {"Authorization": f"Bearer {token}"}
        base = processes.jetway(
            "jetway", PYPY, redis_url, args.workers, settings=[("JETWAY_ACCESS_LOG", "on")]
        )  # fmt: skip
        port = int(base.rsplit(":", 1)[1])
        writer = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        versions: Dict[str, int] = {}
        versions[_put(writer, headers, 0)[0]] = 0
        wrk = ["wrk", "-t1", "-c64", "-d3600s", "-H", f"Authorization: Bearer {token}", base + PATH]
        load = processes.start("wrk", wrk)
        time.sleep(args.warmup)
        probes = _one_probe_per_worker(port, headers, args.workers)
        windows: List[float] = []  # the 2xx to the first fresh read sent, slower worker
        delays: List[float] = []  # the 2xx to the first reads sent (the last of them): the prober's own delay
        stale_writes = stale_reads = stale_on_writer = older_than_seen = mismatched = reads = 0
        niceness = _prefer_the_prober()
        for version in range(1, args.writes + 1):
            etag, writing_worker = _put(writer, headers, version)
            written = time.perf_counter()
            versions[etag] = version
            first_new: Dict[int, float] = {}
            first_round = 0.0
            stale_before = stale_reads
            while len(first_new) < len(probes):
                # Every worker asked at once, then every answer read: a read
                # does not wait for another worker's answer to be sent.
                waiting = [(index, probe) for index, probe in enumerate(probes) if index not in first_new]
                sent_at = [probe.send() for _, probe in waiting]
                first_round = first_round or sent_at[-1]
                for (index, probe), sent in zip(waiting, sent_at):
                    seen, body = probe.receive()
                    reads += 1
                    seen_version = versions.get(seen, -1)
                    mismatched += body != _body(seen_version)
                    older_than_seen += seen_version < probe.highest
                    probe.highest = max(probe.highest, seen_version)
                    if seen == etag:
                        first_new[index] = max(0.0, sent - written)
                    else:
                        stale_reads += 1
                        stale_on_writer += probe.worker == writing_worker
            windows.append(max(first_new.values()))
            delays.append(first_round - written)
            stale_writes += stale_reads > stale_before
        processes.check_alive(load, "wrk")
    figures = {
        "reads": reads,
        "stale reads": stale_reads,
        "stale on writer": stale_on_writer,
        "stale writes": stale_writes,
        "nice": niceness,
    }
    return _staleness_report(args, windows, delays, figures, older_than_seen, mismatched)


def _prefer_the_prober() -> int:
    """Run this process at nice -10 when allowed: its own scheduling delays (2 cores shared with
    wrk, the workers and Redis) would otherwise count as staleness. Returns the niceness it got."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    return os.getpriority(os.PRIO_PROCESS, 0)


def _body(version: int) -> bytes:
    return b'{"v":%d,"pad":"%s"}' % (version, b"x" * 180)


def _put(connection: http.client.HTTPConnection, headers: Dict[str, str], version: int) -> Tuple[str, str]:
    """The new ETag, and which worker took the write (its request-id prefix)."""
    connection.request("PUT", PATH, body=_body(version), headers={**headers, "Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    if response.status not in (200, 201):
        raise RuntimeError(f"PUT answered {response.status}")
    return response.getheader("ETag"), (response.getheader("X-Request-ID") or "")[:16]


def _one_probe_per_worker(port: int, headers: Dict[str, str], workers: int) -> List[Probe]:
    """Connections until each worker has one (a connection stays on the worker that accepted it)."""
    found: Dict[str, Probe] = {}
    for _ in range(200):
        probe = Probe(port, headers)
        probe.send()
        probe.receive()
        if probe.worker not in found:
            found[probe.worker] = probe
        else:
            probe.connection.close()
        if len(found) == workers:
            return list(found.values())
    raise RuntimeError(f"found only {len(found)} of {workers} workers")


def _percentiles(seconds: List[float]) -> Tuple[float, float, float]:
    """p50, p99 and max, in milliseconds."""
    ms = sorted(value * 1000 for value in seconds)
    return statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))], ms[-1]


def _staleness_report(
    args: argparse.Namespace,
    windows: List[float],
    delays: List[float],
    figures: Dict[str, int],
    older: int,
    mismatched: int,
) -> str:
    window, delay = _percentiles(windows), _percentiles(delays)
    holds = window[1] <= 1.0 and older == 0 and mismatched == 0
    row = "| {} | {:.3f} ms | {:.3f} ms | {:.3f} ms |"
    return "\n".join(
        [
            "# Hot cache: staleness window",
            "",
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {args.workers} workers (production defaults:"
            " authorization on with an unrated token, access log on, hot cache at its default bound), wrk -c64"
            f" reading the document throughout, {len(windows):,} writes, each followed by reads on one connection"
            " to each worker (sent together) until both serve the new ETag.",
            "",
            "| from a PUT's 2xx to … | p50 | p99 | max |",
            "|---|---|---|---|",
            row.format("both workers serve the new ETag (the first read that got it, sent)", *window),
            row.format("the first reads sent (the prober's own delay: a floor under the line above)", *delay),
            "",
            f"- writes after which a worker served the old ETag at least once: {figures['stale writes']:,}"
            f" of {len(windows):,}",
            f"- probe reads: {figures['reads']:,}, of which the old ETag: {figures['stale reads']:,}"
            f" ({figures['stale on writer']} on the worker that took the write)",
            f"- the prober ran at nice {figures['nice']}",
            f"- reads older than what the same worker had served before: {older}",
            f"- reads whose body is not their ETag's: {mismatched}",
            "",
            "Default-on condition (p99 ≤ 1 ms, no read older than one the worker served before): "
            + ("holds." if holds else "FAILS."),
            "",
        ]
    )


# --- memory ---------------------------------------------------------------------


def memory_use(args: argparse.Namespace) -> str:
    rows = []
    for bound in (0, args.bound):
        with tempfile.TemporaryDirectory(prefix="hot-memory-") as directory, Processes(Path(directory)) as processes:
            redis_url = processes.redis()
            seed_documents(redis_url, args.docs, args.size)
            token = make_token(str(PYPY), redis_url, "memory")
            settings = [("JETWAY_ACCESS_LOG", "on"), ("JETWAY_HOT_CACHE_BYTES", str(bound))]
            base = processes.jetway("jetway", PYPY, redis_url, args.workers, settings=settings)
            wrk = ["wrk", "-t1", "-c64", f"-d{args.seconds:g}s", "-s", str(WRK_LUA)]
            wrk += ["-H", f"Authorization: Bearer {token}", base + "/v1/mem/x"]
            env = {"BENCH_IDS": str(args.docs), "BENCH_PATH_PREFIX": SEEDED_PREFIX, "BENCH_RANDOM": "1"}
            done = subprocess.run(wrk, env={**os.environ, **env}, capture_output=True, text=True, check=True)
            summary = json.loads(done.stdout.split("BENCH ", 1)[1].splitlines()[0])
            rss = processes.worker_rss_mb("jetway")
            held = _metric(base, "jetway_hot_cache_bytes") if bound else 0.0
            rows.append((bound, summary, rss, held))
    return _memory_report(args, rows)


def seed_documents(redis_url: str, docs: int, size: int) -> None:
    """``docs`` documents laid out as the store writes them (cache/keys.py), through ``redis-cli --pipe``."""
    pad = b"x" * max(0, size - 20)
    commands = []
    for n in range(docs):
        doc_id = b"d%d" % n
        key = b"jw:{mem:%02x}:d:" % (zlib.crc32(doc_id) % 16) + doc_id
        body = b'{"n":%d,"p":"%s"}' % (n, pad)
        args = [b"HSET", key, b"b", body, b"e", b'"m%d"' % n, b"m", b"Mon, 23 Nov 2026 10:00:00 GMT"]
        commands.append(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
    socket_path = redis_url[len("unix://") :]
    subprocess.run(
        ["redis-cli", "-s", socket_path, "--pipe"], input=b"".join(commands), capture_output=True, check=True
    )


def _metric(base: str, name: str) -> float:
    time.sleep(1.1)  # every worker's figures written (once a second)
    connection = http.client.HTTPConnection(base.split("//")[1], timeout=10)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


def _memory_report(args: argparse.Namespace, rows: List[Tuple[int, dict, List[float], float]]) -> str:
    lines = [
        "# Hot cache: worker memory",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {args.workers} workers (production defaults),"
        f" {args.docs:,} documents of {args.size:,} bytes read at random by wrk -c64 for {args.seconds:g} s.",
        "",
        "| JETWAY_HOT_CACHE_BYTES | req/s | p99 | entries hold (all workers) | each worker's RSS | target |",
        "|---|---|---|---|---|---|",
    ]
    for bound, summary, rss, held in rows:
        rps = summary["requests"] / (summary["duration_us"] / 1e6)
        limit = bound / 2**20 + MEMORY_TARGET_MARGIN_MB
        target = f"≤ {limit:.0f} MB: {'met' if all(mb <= limit for mb in rss) else 'MISSED'}" if bound else "(off)"
        lines.append(
            f"| {bound:,} | {rps:,.0f} | {summary['p99_us'] / 1000:.1f} ms | {held / 2**20:.1f} MB"
            f" | {', '.join(f'{mb:.0f} MB' for mb in rss)} | {target} |"
        )
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
