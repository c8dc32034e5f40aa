"""Issue 47's figures: queries over declared indexes beside what they replace, and what indexes cost writes.

One served worker (``loadtest.studies._request_path``'s child: production defaults,
authorization and the access log on) and a private Redis. In one run:

- **equality**: ``GET /v1/eq?email=eq.<v>`` answering 10 documents against
  ``GET /v1/eq?ids=<the same 10>``, interleaved ``--rounds`` of ``--seconds``
  under wrk (64 connections) after a warm-up of each; the worker's and
  Redis's CPU per request (from /proc and ``INFO cpu``).
- **put**: PUTs of ~200 B documents to fresh ids into a collection with three
  indexes (a string, a number, a compound) against one with none,
  interleaved the same way: req/s and CPU per PUT; then each index's memory
  per document (``MEMORY USAGE`` of its sorted sets, and of the documents'
  hashes with and without their entry fields).
- **build**: ``--documents`` documents imported, then an ordered index
  declared (the CLI) and built by the worker: its time and Redis's CPU, and
  the 200 B read's and the PUT's req/s while it builds against after.
- **paging**: pages of 100 in ``order=created.desc`` over those documents:
  the first page against the tenth (after following nine cursors), each
  timed ``--pages`` times, interleaved.

Writes ``loadtest/results/queries.md`` (appended).

    .venv/bin/python -m loadtest.studies._queries [--documents 1000000] [--rounds 4] [--seconds 5]
        [--only put] [--redis-core]

``--redis-core`` gives Redis a core of its own (CPU 1) and the worker and
wrk the other: where Redis runs on its own host, the documents/s a worker
serves is what its own CPU allows; on the shared 2-core machine (the
default) Redis's work for the indexes takes CPU from the worker too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from loadtest import _token
from loadtest._http import send
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._attacks import cpu_seconds
from loadtest.studies._batch_pace import Client, redis_cli, script_calls
from loadtest.studies._bulk import import_stream, redis_cpu_seconds
from loadtest.studies._request_path import WRK_SCRIPT
from loadtest.studies._served import append_report, serve_one

REPORT = ROOT / "loadtest" / "results" / "queries.md"
THREE = {
    "by_email": {"fields": [{"name": "email", "pointer": "/email", "type": "string"}]},
    "by_created": {"fields": [{"name": "created", "pointer": "/created", "type": "number"}]},
    "by_team_created": {
        "fields": [
            {"name": "team", "pointer": "/team", "type": "string"},
            {"name": "created", "pointer": "/created", "type": "number"},
        ]
    },
}


class Served:
    """The worker, its Redis and a token: requests, wrk runs and CPU readings against them."""

    def __init__(self, processes: Processes, python: Path, scratch: Path, redis_core: bool = False) -> None:
        self.python, self.scratch = python, scratch
        # --redis-core: Redis alone on CPU 1, the worker and wrk on CPU 0 (as where Redis has a host of its own).
        self.wrk_prefix = ["taskset", "-c", "0"] if redis_core else []
        self.redis_url = processes.redis(cpus=[1] if redis_core else None)
        self.socket = self.redis_url[len("unix://") :]
        self.token = _token.resolve(str(python), self.redis_url).token or ""
        self.worker, self.base, _ = serve_one(
            processes, python, self.redis_url, self.token, scratch, cpus=[0] if redis_core else None
        )

    def request(self, method: str, path: str, body: bytes = b"") -> Tuple[int, bytes]:
        return send(self.base, method, path, self.token, body or None)

    def declare(self, collection: str, indexes: Dict[str, Any]) -> None:
        """Through the CLI, as an operator would (the load test's token has no admin scope)."""
        file = self.scratch / f"{collection}-indexes.json"
        file.write_text(json.dumps(indexes))
        subprocess.run(
            [str(self.python), "-m", "api", "collections", "set", collection, "--indexes", str(file)],
            cwd=ROOT,
            env={**os.environ, "REDIS_URL": self.redis_url},
            check=True,
            capture_output=True,
        )
        time.sleep(0.3)  # the worker's settings cache hears of it

    def wrk(self, path: str, seconds: float, connections: int = 64, **env: str) -> Dict[str, Any]:
        """wrk on ``path``; its summary, with the worker's and Redis's CPU seconds over the run."""
        command = [*self.wrk_prefix, "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(WRK_SCRIPT)]
        command += [f"-HAuthorization: Bearer {self.token}", self.base + path]
        worker, redis = cpu_seconds(self.worker.pid), redis_cpu_seconds(self.socket)
        _, scripts = script_calls(self.socket)
        done = subprocess.run(command, env={**os.environ, **env}, check=True, capture_output=True, text=True)
        summary = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("BENCH "))[6:])
        summary["worker_s"] = cpu_seconds(self.worker.pid) - worker
        summary["redis_s"] = redis_cpu_seconds(self.socket) - redis
        # Of Redis's CPU, the scripts' own time (INFO commandstats): the rest is reading and answering commands.
        summary["scripts_s"] = (script_calls(self.socket)[1] - scripts) / 1e6
        summary["rps"] = summary["requests"] / (summary["duration_us"] / 1e6)
        errors = sum(summary[kind] for kind in ("status", "timeout", "read", "write", "connect"))
        if errors:
            raise RuntimeError(f"wrk {path}: {errors} errors")
        return summary


def per_request(runs: List[Dict[str, Any]], what: str) -> float:
    return statistics.median(run[what] / run["requests"] * 1e6 for run in runs)


def equality(served: Served, rounds: int, seconds: float) -> List[str]:
    served.declare("eq", {"by_email": THREE["by_email"]})
    for n in range(1000):
        document = {"email": f"u{n // 10}@x.example", "created": n, "team": "t", "pad": "x" * 140}
        status, _ = served.request("PUT", f"/v1/eq/d{n:04d}", json.dumps(document).encode())
        assert status in (200, 201), status
    ids = ",".join(f"d{n:04d}" for n in range(70, 80))
    paths = {"query of 10": "/v1/eq?email=eq.u7@x.example", "multi-get of the same 10": f"/v1/eq?ids={ids}"}
    for name, path in paths.items():
        status, body = served.request("GET", path)
        assert status == 200 and len(json.loads(body)["items"]) == 10, (name, status, body[:200])
        served.wrk(path, seconds)  # the JIT's warm-up
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in paths}
    for number in range(rounds):
        for name in paths if number % 2 == 0 else reversed(list(paths)):
            runs[name].append(served.wrk(paths[name], seconds))
    query, multi = runs["query of 10"], runs["multi-get of the same 10"]
    pairs = [q["worker_s"] / q["requests"] / (m["worker_s"] / m["requests"]) for q, m in zip(query, multi)]
    return [
        "| | req/s (median) | worker µs/request | Redis µs/request |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {statistics.median(r['rps'] for r in rs):,.0f} | {per_request(rs, 'worker_s'):.1f}"
            f" | {per_request(rs, 'redis_s'):.1f} |"
            for name, rs in runs.items()
        ),
        "",
        f"Worker CPU, query / multi-get, per round: {', '.join(f'{p:.2f}x' for p in pairs)}"
        f" (median **{statistics.median(pairs):.2f}x**; the target ≤ 2x).",
    ]


def puts(served: Served, rounds: int, seconds: float) -> List[str]:
    served.declare("indexed", THREE)
    body = served.scratch / "put.json"
    body.write_text(json.dumps({"email": "a@x.example", "created": 12345, "team": "red", "pad": "x" * 140}))
    names = {"no index": "/v1/plain/", "three indexes": "/v1/indexed/"}
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in names}
    first = 0
    for number in range(rounds + 1):  # the first round warms the JIT up
        for name in names if number % 2 == 0 else reversed(list(names)):
            env = {"BENCH_METHOD": "PUT", "BENCH_BODY_FILE": str(body), "BENCH_IDS": "10000000"}
            env |= {"BENCH_PATH_PREFIX": names[name], "BENCH_FIRST_ID": str(first)}
            run = served.wrk(names[name] + "0", seconds, **env)
            first += run["requests"] + 64
            if number:
                runs[name].append(run)
    ratios = [i["rps"] / p["rps"] for i, p in zip(runs["three indexes"], runs["no index"])]
    memory = index_memory(served)
    return [
        "| | PUT req/s (median) | worker µs/PUT | Redis µs/PUT | of which in scripts |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {statistics.median(r['rps'] for r in rs):,.0f} | {per_request(rs, 'worker_s'):.1f}"
            f" | {per_request(rs, 'redis_s'):.1f} | {per_request(rs, 'scripts_s'):.1f} |"
            for name, rs in runs.items()
        ),
        "",
        f"Three indexes / none, PUTs/s per round: {', '.join(f'{r:.2f}x' for r in ratios)}"
        f" (median **{statistics.median(ratios):.2f}x**; the target ≥ 0.85x). Fresh ids each (creates).",
        "",
        memory,
    ]


def batches(served: Served, rounds: int, seconds: float) -> List[str]:
    """100-PUT batches of fresh ids into the three-index collection against the same into one with none.

    On one keep-alive connection, alternating for ``seconds`` each, ``rounds`` times after a warm-up of as
    many: documents/s of each, and the script time Redis spent per document (``INFO commandstats``).
    """
    client = Client(served.base, {"Authorization": f"Bearer {served.token}"})
    names = {"no index": "plain", "three indexes": "indexed"}
    counter = iter(range(10**9))

    def batch_of_100(collection: str) -> None:
        operations = []
        for _ in range(100):
            n = next(counter)
            document = {"email": f"b{n}@x.example", "created": n, "team": f"t{n % 7}", "pad": "x" * 140}
            operations.append({"op": "put", "collection": collection, "id": f"b{n}", "document": document})
        status, answer = client.send("POST", "/v1/_batch", json.dumps({"operations": operations}).encode())
        if status != 200 or any(result["status"] != 201 for result in json.loads(answer)["results"]):
            raise RuntimeError(f"batch into {collection}: {status} {answer[:300]!r}")

    rates: Dict[str, List[float]] = {name: [] for name in names}
    scripts: Dict[str, List[float]] = {name: [] for name in names}
    for number in range(2 * rounds):  # the first half warms the JIT up
        for name in names if number % 2 == 0 else reversed(list(names)):
            _, usec = script_calls(served.socket)
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                batch_of_100(names[name])
                done += 100
            elapsed = time.perf_counter() - started
            if number >= rounds:
                rates[name].append(done / elapsed)
                scripts[name].append((script_calls(served.socket)[1] - usec) / done)
    ratios = [i / p for i, p in zip(rates["three indexes"], rates["no index"])]
    return [
        "| | documents/s in batches of 100 (median) | Redis µs in scripts per document |",
        "|---|---:|---:|",
        *(
            f"| {name} | {statistics.median(rates[name]):,.0f} | {statistics.median(scripts[name]):.1f} |"
            for name in names
        ),
        "",
        f"Three indexes / none, documents/s per round: {', '.join(f'{r:.2f}x' for r in ratios)}"
        f" (median **{statistics.median(ratios):.2f}x**; the target ≥ 0.85x). Fresh ids each (creates),"
        " one connection.",
    ]


def index_memory(served: Served) -> str:
    """Bytes per document of each index's sorted sets, and of the entry fields in a document's hash."""
    sockets = served.socket
    documents = int(redis_cli(sockets, "EVAL", _COUNT_IDS, "0", "jw:{indexed:*}:i").strip() or 0)
    parts = []
    for name in THREE:
        used = int(redis_cli(sockets, "EVAL", _SUM_MEMORY, "0", f"ji:{{indexed:*}}:x:{name}:*").strip() or 0)
        parts.append(f"{name} {used / max(documents, 1):.0f} B")
    sample = redis_cli(sockets, "EVAL", _SAMPLE_HASH, "0", "jw:{indexed:*}:d:*").split()
    return (
        f"Index memory per document ({documents:,} documents, `MEMORY USAGE` of the sorted sets): "
        + ", ".join(parts)
        + f"; a document's hash {sample[0]} B with its three entry fields, {sample[1]} B without."
    )


_SCAN = """
local keys, cursor = {}, '0'
repeat
  local found = redis.call('SCAN', cursor, 'MATCH', ARGV[1] or KEYS[1], 'COUNT', 1000)
  cursor = found[1]
  for _, key in ipairs(found[2]) do keys[#keys + 1] = key end
until cursor == '0'
"""
_COUNT_IDS = (
    "local pattern = ARGV[1] "
    + _SCAN.replace("ARGV[1] or KEYS[1]", "pattern")
    + """
local total = 0
for _, key in ipairs(keys) do total = total + redis.call('ZCARD', key) end
return total"""
)
_SUM_MEMORY = (
    "local pattern = ARGV[1] "
    + _SCAN.replace("ARGV[1] or KEYS[1]", "pattern")
    + """
local total = 0
for _, key in ipairs(keys) do total = total + redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0) end
return total"""
)
_SAMPLE_HASH = """
local found = redis.call('SCAN', '0', 'MATCH', ARGV[1], 'COUNT', 1000)
local key = found[2][1]
local with = redis.call('MEMORY', 'USAGE', key)
local fields = redis.call('HGETALL', key)
local copy = key .. ':copy'
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 2) ~= 'x:' then redis.call('HSET', copy, fields[i], fields[i + 1]) end
end
local without = redis.call('MEMORY', 'USAGE', copy)
redis.call('DEL', copy)
return with .. ' ' .. without"""


def build_and_pages(served: Served, documents: int, seconds: float, pages: int) -> List[str]:
    lines = []
    for start in range(0, documents, 100_000):
        count = min(100_000, documents - start)
        body = b"".join(
            json.dumps({"id": f"d{n:09d}", "created": (n * 7919) % documents, "team": f"t{n % 10}"}).encode() + b"\n"
            for n in range(start, start + count)
        )
        result: Dict[str, Any] = {}
        import_stream(served.base, f"Bearer {served.token}", body, [0], result, "late")
        if result.get("status") != "200":
            raise RuntimeError(f"import: {result}")
    # The 200 B read and the PUT, each on half the connections, before any index: the rates to keep.
    served.request("PUT", "/v1/users/u1", json.dumps({"name": "x" * 180}).encode())
    before = side_by_side(served, seconds)
    redis_before = redis_cpu_seconds(served.socket)
    started = time.perf_counter()
    served.declare("late", {"by_created": THREE["by_created"]})
    status, _ = served.request("GET", "/v1/late?order=created.desc&limit=1")  # starts the build
    during = side_by_side(served, seconds)
    while status == 409:
        time.sleep(0.1)
        status, _ = served.request("GET", "/v1/late?order=created.desc&limit=1")
    took = time.perf_counter() - started
    redis_busy = redis_cpu_seconds(served.socket) - redis_before
    lines += [
        f"Build of an ordered index over {documents:,} documents: **{took:.1f} s** from the declaration to the"
        f" first answer ({documents / took:,.0f} documents/s); Redis's CPU in that time {redis_busy:.1f} s"
        f" ({redis_busy / took:.0%} of a core, the reads and writes below included).",
        "",
        "| while | 200 B read req/s | PUT req/s |",
        "|---|---:|---:|",
        f"| before the index | {before[0]:,.0f} | {before[1]:,.0f} |",
        f"| during its build (the first {2 * seconds:g} s) | {during[0]:,.0f} | {during[1]:,.0f} |",
        f"| ratio | **{during[0] / before[0]:.2f}x** | **{during[1] / before[1]:.2f}x** |",
        "",
    ]
    first, tenth = [], []
    for _ in range(pages):
        for which in ("first", "tenth"):
            cursor = ""
            for _page in range(10 if which == "tenth" else 1):
                began = time.perf_counter()
                status, body = served.request("GET", f"/v1/late?order=created.desc&limit=100{cursor}")
                elapsed = time.perf_counter() - began
                assert status == 200, body[:200]
                cursor = "&cursor=" + json.loads(body)["next"]
            (tenth if which == "tenth" else first).append(elapsed * 1000)
    lines.append(
        f"Pages of 100 in `order=created.desc` over {documents:,} documents, {pages} of each, interleaved: the first"
        f" {statistics.median(first):.2f} ms (median), the tenth {statistics.median(tenth):.2f} ms"
        f" (**{statistics.median(tenth) / statistics.median(first):.2f}x**)."
    )
    return lines


def side_by_side(served: Served, seconds: float) -> Tuple[float, float]:
    """The 200 B read's and the PUT's req/s, each on 32 connections, run at once."""
    body = served.scratch / "user.json"
    body.write_text(json.dumps({"name": "x" * 180}))
    import threading

    results: Dict[str, Dict[str, Any]] = {}
    reading = threading.Thread(target=lambda: results.update(read=served.wrk("/v1/users/u1", seconds, 32)))
    reading.start()
    results["put"] = served.wrk("/v1/users/u2", seconds, 32, BENCH_METHOD="PUT", BENCH_BODY_FILE=str(body))
    reading.join()
    return results["read"]["rps"], results["put"]["rps"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--only", choices=("equality", "put", "build"), help="one part alone")
    parser.add_argument(
        "--redis-core", action="store_true", help="Redis alone on CPU 1; the worker and wrk share CPU 0 (2 cores)"
    )
    args = parser.parse_args()
    stop_on_sigterm()
    pinned = " --redis-core" if args.redis_core else ""
    lines = [
        f"`python -m loadtest.studies._queries --documents {args.documents} --rounds {args.rounds}"
        f" --seconds {args.seconds:g}"
        f" --pages {args.pages}{pinned}{' --only ' + args.only if args.only else ''}`: one worker (production"
        " defaults), a private Redis, wrk -c64"
        + ("; Redis alone on CPU 1, the worker and wrk on CPU 0." if args.redis_core else "."),
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="jetway-queries-") as scratch, Processes(Path(scratch)) as processes:
        served = Served(processes, Path(sys.executable), Path(scratch), args.redis_core)
        if args.only in (None, "equality"):
            lines += [
                "### An equality query of 10 against a multi-get of the same 10",
                "",
                *equality(served, args.rounds, args.seconds),
                "",
            ]
        if args.only in (None, "put"):
            lines += ["### PUTs into a collection with three indexes", "", *puts(served, args.rounds, args.seconds), ""]
            lines += ["### Batches of 100 PUTs into it", "", *batches(served, args.rounds, args.seconds), ""]
        if args.only in (None, "build"):
            lines += [
                "### Building an index, and paging through it",
                "",
                *build_and_pages(served, args.documents, args.seconds, args.pages),
            ]
    append_report(REPORT, "Queries over declared indexes", "run", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
