"""The side-by-side bench: every server and endpoint under wrk, interleaved.

Servers (all on one private Redis, all running for the whole bench):
Jetway on PyPy with N workers (the reference), the same on CPython 3.11,
PyPy with 1 worker, nginx serving the same bytes from static files (the
ceiling for an HTTP server here), and PyPy with a read path that decodes and
re-encodes every body (``_reencode_app``: what storing bytes saves).

Endpoints: GET of a small and a large document, PUT of a small one, a list
page of 100 and a multi-get of 20.

Each server first gets ``warmup`` seconds of load spread over its endpoints
(PyPy's JIT compiles what it runs); then ``rounds`` rounds measure every
(endpoint, server) case once each, the servers in a rotated order every
round, so a drift of the machine shows as spread rather than as a ratio.

By default nothing is pinned: wrk, Redis and the servers share the cores,
as the targets are stated (a 2-core machine with wrk and Redis on the same
box), and N workers can use N cores. ``--pin auto`` gives wrk its own core
instead, which steadies the figures but leaves one core to all the servers'
workers and Redis.

Every Jetway server runs with the production defaults, authorization on
(the bench sends an unrated token made with the admin CLI) and the access
log on, unless ``--server-env`` (``BENCH_SERVER_ENV``) says otherwise, say
``JETWAY_ACCESS_LOG=off JETWAY_AUTH=off``: the report shows what users get.

At the end the resident memory of every Jetway worker is read, after the
whole bench's load. Then, as the target is stated, a fresh reference server
(PyPy, N workers) serves ``--rss-seconds`` (60) of the small read, and its
workers' resident memory is read; the report checks the read path's targets.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from loadtest import _bench_validators as _validators
from loadtest import _data, _token
from loadtest._run import machine
from loadtest._servers import CPYTHON, PYPY, Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.bench import _report

HERE = Path(__file__).resolve().parent
WRK_SCRIPT = HERE / "wrk.lua"
RESULTS = ROOT / "loadtest" / "results"
REFERENCE = "pypy"
FRESH = "pypy-fresh"  # the reference, started anew for the memory run
SCHEMA_COLLECTION = "bench-schema"
SCHEMA_DOCUMENT = json.dumps(_validators.document(), separators=(",", ":"))
LIST_DOCS = 200
MULTI_GET = 20
MULTI_GET_MANY = 500
BATCH = 100
# What a Jetway server runs with unless --server-env or its own row says otherwise.
PRODUCTION_DEFAULTS = (("JETWAY_AUTH", "on"), ("JETWAY_ACCESS_LOG", "on"))
PAGE = 100
MIN_WARMUP = 15.0
MIN_ROUNDS = 2


@dataclass(frozen=True)
class Server:
    key: str
    label: str
    kind: str  # jetway | nginx
    python: Optional[Path] = None
    module: str = "api"
    workers: int = 1
    env: Tuple[Tuple[str, str], ...] = ()  # settings of this server only
    only: Tuple[str, ...] = ()  # the endpoints it is measured on (all when empty)

    def measures(self, endpoint: Endpoint) -> bool:
        if endpoint.varies and self.kind != "jetway":
            return False  # a static file cannot answer it
        return not self.only or endpoint.key in self.only

    @property
    def needs_replica(self) -> bool:
        return dict(self.env).get("JETWAY_WRITE_REPLICAS", "0") != "0"


@dataclass(frozen=True)
class Endpoint:
    key: str
    label: str
    method: str
    path: str
    body: Optional[str] = None  # sent as it is (a PUT sends a document instead); text, for bench.json
    headers: Tuple[Tuple[str, str], ...] = ()  # sent besides the token
    size: str = "small"  # the document a PUT sends: small or large
    connections: int = 0  # wrk's connections for this endpoint (0: the bench's --connections)
    documents: int = 1  # documents one request carries (a batch's operations)
    varies: bool = False  # the answer differs every time (ETags in the body): only its status is checked


@dataclass
class Run:
    """One wrk measurement."""

    server: str
    endpoint: str
    round: int
    order: int
    seconds: float
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    started: float = field(default_factory=time.time)
    bytes_per_request: float = 0.0  # of the response, headers included, as wrk read it


@dataclass(frozen=True)
class CpuPlan:
    loadgen: Optional[List[int]]
    server: Optional[List[int]]
    description: str


def jetway_settings(server_env: str, own: Sequence[Tuple[str, str]] = ()) -> Tuple[Tuple[str, str], ...]:
    """A Jetway server's settings: the production defaults, then ``--server-env`` (``K=V ...``), then its row's own."""
    given = dict(item.split("=", 1) for item in server_env.split())
    return tuple({**dict(PRODUCTION_DEFAULTS), **given, **dict(own)}.items())


def plan_cpus(pin: str, available: Sequence[int]) -> CpuPlan:
    """wrk on the first quarter of the cores (at least one), servers on the rest."""
    cpus = sorted(available)
    if pin == "off":
        return CpuPlan(None, None, f"not pinned (--pin off): wrk and servers share cores {cpus}")
    if len(cpus) < 2:
        return CpuPlan(None, None, f"not pinned: only one core ({cpus}) for wrk and the servers")
    share = max(1, len(cpus) // 4)
    loadgen, server = cpus[:share], cpus[share:]
    text = f"pinned: wrk on cores {loadgen}, servers (Jetway, nginx, Redis) on cores {server}"
    return CpuPlan(loadgen, server, text)


def servers(workers: int) -> List[Server]:
    return [
        Server(REFERENCE, f"Jetway PyPy, {workers} workers", "jetway", PYPY, workers=workers),
        Server("cpython", f"Jetway CPython 3.11, {workers} workers", "jetway", CPYTHON, workers=workers),
        Server("pypy1", "Jetway PyPy, 1 worker", "jetway", PYPY, workers=1),
        Server("cpython1", "Jetway CPython 3.11, 1 worker", "jetway", CPYTHON, workers=1),
        Server("nginx", f"nginx static file, {workers} workers", "nginx", workers=workers),
        # Writes answered once a replica has them (cache/documents/write_concern.py); choosing it gives Redis a replica.
        Server(
            "wait1",
            f"Jetway PyPy, {workers} workers, JETWAY_WRITE_REPLICAS=1",
            "jetway",
            PYPY,
            workers=workers,
            env=(("JETWAY_WRITE_REPLICAS", "1"),),
        ),
        # Documents stored without compressed variants: what making them at write time costs.
        Server(
            "plain",
            f"Jetway PyPy, {workers} workers, no compressed variants",
            "jetway",
            PYPY,
            workers=workers,
            env=(("JETWAY_COMPRESS_MIN_BYTES", "0"),),
            only=("get-large", "put-large"),
        ),
        # Writes that log no change event (JETWAY_FEED=off): what the feed costs a write (issue 23: <= 10%).
        Server(
            "nofeed",
            f"Jetway PyPy, {workers} workers, no change feed",
            "jetway",
            PYPY,
            workers=workers,
            env=(("JETWAY_FEED", "off"),),
            only=("put", "put-large"),
        ),
        Server(
            "reencode",
            f"PyPy decode+re-encode, {workers} workers",
            "jetway",
            PYPY,
            "loadtest.bench._reencode_app",
            workers,
        ),
    ]


def endpoints(small: int, large: int) -> List[Endpoint]:
    mget = ",".join(_data.ids("m", LIST_DOCS)[:: LIST_DOCS // MULTI_GET][:MULTI_GET])
    # 500 ids over the 200 documents (duplicates are answered in place): the
    # GET form's request line still holds them; the POST form, any number.
    many = (_data.ids("m", LIST_DOCS) * (MULTI_GET_MANY // LIST_DOCS + 1))[:MULTI_GET_MANY]
    many_body = json.dumps({"ids": many})
    document = json.loads(_data.document("doc", small))
    batch = [{"op": "put", "collection": "bench-batch", "id": f"b{n}", "document": document} for n in range(BATCH)]
    return [
        Endpoint("get-small", f"GET /v1/{{coll}}/{{id}} ({small} B)", "GET", "/v1/bench-small/doc"),
        Endpoint("get-large", f"GET /v1/{{coll}}/{{id}} ({large // 1024} KB)", "GET", "/v1/bench-large/doc"),
        Endpoint(
            "get-large-gzip",
            f"GET /v1/{{coll}}/{{id}} ({large // 1024} KB), gzip",
            "GET",
            "/v1/bench-large/doc",
            headers=(("Accept-Encoding", "gzip"),),
        ),
        Endpoint("put", f"PUT /v1/{{coll}}/{{id}} ({small} B)", "PUT", "/v1/bench-put/doc"),
        # The same ~1 KB document into a collection without settings and into one with a
        # 10-property schema (issue 21's target: with / without >= 0.85), one after the other.
        Endpoint("put-1k", "PUT 1 KB, no schema", "PUT", "/v1/bench-put-1k/doc", SCHEMA_DOCUMENT),
        Endpoint(
            "put-1k-schema", "PUT 1 KB, 10-property schema", "PUT", f"/v1/{SCHEMA_COLLECTION}/doc", SCHEMA_DOCUMENT
        ),
        Endpoint(
            "put-large", f"PUT /v1/{{coll}}/{{id}} ({large // 1024} KB)", "PUT", "/v1/bench-put-large/doc", size="large"
        ),
        # The batch's target: documents per second through one keep-alive connection, request after request.
        Endpoint(
            "put-1c", f"PUT /v1/{{coll}}/{{id}} ({small} B), 1 connection", "PUT", "/v1/bench-put/doc", connections=1
        ),
        Endpoint(
            f"batch-{BATCH}",
            f"POST /v1/_batch of {BATCH} PUTs ({small} B), 1 connection",
            "POST",
            "/v1/_batch",
            json.dumps({"operations": batch}),
            headers=(("Prefer", "return=minimal"),),
            connections=1,
            documents=BATCH,
            varies=True,
        ),
        Endpoint("list-100", f"GET list page of {PAGE}", "GET", f"/v1/bench-list?limit={PAGE}"),
        Endpoint("mget-20", f"GET multi-get of {MULTI_GET}", "GET", f"/v1/bench-mget?ids={mget}"),
        Endpoint(
            f"mget-{MULTI_GET_MANY}",
            f"GET multi-get of {MULTI_GET_MANY}",
            "GET",
            f"/v1/bench-mget-many?ids={','.join(many)}",
        ),
        Endpoint(
            f"mget-{MULTI_GET_MANY}-post",
            f"POST multi-get of {MULTI_GET_MANY}",
            "POST",
            "/v1/_get/bench-mget-many",
            many_body,
        ),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.warmup, args.duration = min(args.warmup, 2.0), min(args.duration, 2.0)
        args.rss_seconds = min(args.rss_seconds, 2.0)
    stop_on_sigterm()
    plan = plan_cpus(args.pin, os.sched_getaffinity(0))
    chosen = [server for server in servers(args.workers) if server.key in args.servers]
    points = [endpoint for endpoint in endpoints(args.small, args.large) if endpoint.key in args.endpoints]
    if REFERENCE not in [server.key for server in chosen]:
        print(f"bench: the reference server {REFERENCE!r} must be among --servers", file=sys.stderr)
        return 2
    print(f"bench: {plan.description}", flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="jetway-bench-") as scratch:
        os.chmod(scratch, 0o755)  # nginx's workers read the static files under it
        bench = Bench(args, plan, chosen, points, Path(scratch))
        with Processes(Path(scratch)) as processes:
            runs = bench.run(processes)
    summary = _summary(args, plan, chosen, points, runs, bench)
    (args.results / "bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    markdown = _report.markdown(summary)
    (args.results / "bench.md").write_text(markdown)
    _report.plot(summary, args.results / "bench.png")
    print(markdown)
    print(f"bench: wrote {args.results / 'bench.md'}, {args.results / 'bench.png'}, {args.results / 'bench.json'}")
    return 1 if any(run.errors for run in runs) else 0


class Bench:
    def __init__(self, args: Any, plan: CpuPlan, chosen: List[Server], points: List[Endpoint], scratch: Path) -> None:
        self.args = args
        self.plan = plan
        self.servers = chosen
        self.endpoints = points
        self.scratch = scratch
        self.bases: Dict[str, str] = {}
        self.headers: Dict[str, str] = {}
        self.token_source = ""
        self.expected: Dict[str, bytes] = {}
        self.mismatches: List[str] = []
        self.worker_rss_mb: Dict[str, List[float]] = {}
        self.fresh_rss_mb: List[float] = []

    def run(self, processes: Processes) -> List[Run]:
        # Every server shares the one Redis; with a replica when a server waits for one.
        with_replica = any(server.needs_replica for server in self.servers)
        redis_url = processes.redis(cpus=self.plan.server, replica=with_replica)
        for server in self.servers:
            if server.kind == "jetway":
                print(f"bench: starting {server.label}", flush=True)
                settings = jetway_settings(self.args.server_env, server.env)
                self.bases[server.key] = processes.jetway(
                    server.key, server.python, redis_url, server.workers, self.plan.server, server.module, settings
                )
        token = _token.resolve(str(PYPY), redis_url, os.environ.get("JETWAY_TOKEN", ""))
        self.headers, self.token_source = token.headers(), token.source
        self._set_schema(redis_url)
        self._seed(self.bases[REFERENCE])
        if any(server.kind == "nginx" for server in self.servers):
            root = self._static_root()
            workers = next(server.workers for server in self.servers if server.kind == "nginx")
            self.bases["nginx"] = processes.nginx(root, workers, self.plan.server)
        self._verify()
        self._warm_up()
        runs = self._measure()
        self.worker_rss_mb = {
            server.key: processes.worker_rss_mb(server.key) for server in self.servers if server.kind == "jetway"
        }
        small_read = next((endpoint for endpoint in self.endpoints if endpoint.key == "get-small"), None)
        if self.args.rss_seconds > 0 and small_read is not None:
            self.fresh_rss_mb = self._fresh_run_rss(processes, redis_url, small_read)
        return runs

    def _fresh_run_rss(self, processes: Processes, redis_url: str, endpoint: Endpoint) -> List[float]:
        """Resident memory of a fresh reference server's workers after ``--rss-seconds`` of ``endpoint``."""
        reference = next(server for server in self.servers if server.key == REFERENCE)
        fresh = replace(reference, key=FRESH, label=f"{reference.label}, fresh")
        print(f"bench: {fresh.label}: {self.args.rss_seconds:g} s of {endpoint.label}, then its memory", flush=True)
        cpus = self.plan.server
        settings = jetway_settings(self.args.server_env, fresh.env)
        self.bases[FRESH] = processes.jetway(
            FRESH, fresh.python, redis_url, fresh.workers, cpus, fresh.module, settings
        )
        run = self.wrk(fresh, endpoint, self.args.rss_seconds, 0, 0)
        if run.errors:
            raise RuntimeError(f"{fresh.label}: {run.errors} errors in the memory run")
        return processes.worker_rss_mb(FRESH)

    def _seed(self, base: str) -> None:
        small, large = self.args.small, self.args.large
        documents = [("bench-small", "doc", small), ("bench-large", "doc", large), ("bench-put", "doc", small)]
        documents.append(("bench-put-large", "doc", large))
        for collection in ("bench-list", "bench-mget", "bench-mget-many"):
            documents += [(collection, doc_id, small) for doc_id in _data.ids("m", LIST_DOCS)]
        with Client(base, self.headers) as client:
            for path in ("/v1/bench-put-1k/doc", f"/v1/{SCHEMA_COLLECTION}/doc"):
                client.send("PUT", path, SCHEMA_DOCUMENT.encode())
            for collection, doc_id, size in documents:
                status, body = client.send("PUT", f"/v1/{collection}/{doc_id}", _data.document(doc_id, size))
                if status not in (200, 201):
                    raise RuntimeError(f"seeding {collection}/{doc_id}: {status} {body[:200]!r}")
            for endpoint in filter(lambda endpoint: not endpoint.varies, self.endpoints):
                status, body = client.send(endpoint.method, endpoint.path, self._body(endpoint), endpoint.headers)
                if status != 200:
                    raise RuntimeError(f"{endpoint.method} {endpoint.path} on the reference: {status} {body[:200]!r}")
                self.expected[endpoint.key] = body

    def _set_schema(self, redis_url: str) -> None:
        """The 10-property schema on ``SCHEMA_COLLECTION``, with the CLI (the bench's token is not admin)."""
        schema_file = self.scratch / "bench-schema.json"
        schema_file.write_text(json.dumps(_validators.SCHEMA))
        command = [str(PYPY), "-m", "api", "collections", "set", SCHEMA_COLLECTION, "--schema", str(schema_file)]
        result = subprocess.run(
            command, cwd=ROOT, env={**os.environ, "REDIS_URL": redis_url}, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise RuntimeError(f"setting the bench schema: {result.stderr}")

    def _body(self, endpoint: Endpoint) -> Optional[bytes]:
        if endpoint.body is not None:
            return endpoint.body.encode()
        size = self.args.large if endpoint.size == "large" else self.args.small
        return _data.document("doc", size) if endpoint.method == "PUT" else None

    def _static_root(self) -> Path:
        """The reference's response bodies as files, at the same paths."""
        root = self.scratch / "www"
        for endpoint in filter(lambda endpoint: not endpoint.varies, self.endpoints):
            target = root / urlsplit(endpoint.path).path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.expected[endpoint.key])
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        return root

    def _verify(self) -> None:
        """Every server answers every endpoint 200 with the reference's bytes."""
        for server in self.servers:
            with Client(self.bases[server.key], self.headers) as client:
                for endpoint in filter(server.measures, self.endpoints):
                    status, body = client.send(endpoint.method, endpoint.path, self._body(endpoint), endpoint.headers)
                    if status != 200:
                        raise RuntimeError(f"{server.label}: {endpoint.method} {endpoint.path} answered {status}")
                    if not endpoint.varies and body != self.expected[endpoint.key]:
                        self.mismatches.append(f"{server.label}, {endpoint.label}: {len(body)} bytes differ")

    def _warm_up(self) -> None:
        share = max(1.0, self.args.warmup / len(self.endpoints))
        for server in self.servers:
            mine = list(filter(server.measures, self.endpoints))
            print(f"bench: warming up {server.label} ({share * len(mine):.0f} s)", flush=True)
            for endpoint in mine:
                self.wrk(server, endpoint, share, -1, 0)

    def _measure(self) -> List[Run]:
        runs: List[Run] = []
        total = self.args.rounds * sum(
            server.measures(endpoint) for server in self.servers for endpoint in self.endpoints
        )
        for round_number in range(1, self.args.rounds + 1):
            turn = (round_number - 1) % len(self.servers)
            order = self.servers[turn:] + self.servers[:turn]
            for endpoint in self.endpoints:
                for server in filter(lambda server: server.measures(endpoint), order):
                    run = self.wrk(server, endpoint, self.args.duration, round_number, len(runs) + 1)
                    runs.append(run)
                    print(
                        f"bench: [{run.order}/{total}] round {round_number} {_progress(run, endpoint, server)}",
                        flush=True,
                    )
                    time.sleep(self.args.pause)
        return runs

    def wrk(self, server: Server, endpoint: Endpoint, seconds: float, round_number: int, order: int) -> Run:
        connections = endpoint.connections or self.args.connections
        threads = min(connections, len(self.plan.loadgen) if self.plan.loadgen else 1)
        command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s"]
        command += ["--timeout", "10s", "-s", str(WRK_SCRIPT)]
        for name, value in (*self.headers.items(), *endpoint.headers):
            command += ["-H", f"{name}: {value}"]
        command.append(self.bases[server.key] + endpoint.path)
        env = {**os.environ, "BENCH_METHOD": endpoint.method}
        if endpoint.method != "GET":
            body_file = self.scratch / f"{endpoint.key}-body.json"
            body_file.write_bytes(self._body(endpoint) or b"")
            env["BENCH_BODY_FILE"] = str(body_file)
        cpus = self.plan.loadgen
        started = time.time()
        result = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        return parse_wrk(result.stdout, server.key, endpoint.key, round_number, order, started, result.stderr)


def _progress(run: Run, endpoint: Endpoint, server: Server) -> str:
    errors = f"  ERRORS {run.errors}" if run.errors else ""
    return f"{endpoint.label:34} {server.label:38} {run.rps:10.0f} req/s  p99 {run.p99_ms:7.2f} ms{errors}"


def parse_wrk(
    output: str, server: str, endpoint: str, round_number: int, order: int, started: float, stderr: str = ""
) -> Run:
    line = next((line for line in output.splitlines() if line.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary for {server} {endpoint}: {output[-500:]} {stderr[-500:]}")
    data = json.loads(line[len("BENCH ") :])
    seconds = data["duration_us"] / 1e6
    errors = sum(data[kind] for kind in ("connect", "read", "write", "status", "timeout"))
    return Run(
        server=server,
        endpoint=endpoint,
        round=round_number,
        order=order,
        seconds=round(seconds, 3),
        requests=data["requests"],
        rps=round(data["requests"] / seconds, 1) if seconds else 0.0,
        p50_ms=round(data["p50_us"] / 1000, 3),
        p99_ms=round(data["p99_us"] / 1000, 3),
        errors=errors,
        started=started,
        bytes_per_request=round(data["bytes"] / data["requests"], 1) if data["requests"] else 0.0,
    )


class Client:
    """One keep-alive HTTP connection for seeding and checking."""

    def __init__(self, base: str, headers: Dict[str, str]) -> None:
        url = urlsplit(base)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        self.headers = headers

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.connection.close()

    def send(
        self, method: str, path: str, body: Optional[bytes] = None, extra: Sequence[Tuple[str, str]] = ()
    ) -> Tuple[int, bytes]:
        headers = {**self.headers, **dict(extra)}
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        return response.status, response.read()


def _summary(
    args: Any, plan: CpuPlan, chosen: List[Server], points: List[Endpoint], runs: List[Run], bench: Bench
) -> Dict[str, Any]:
    cases: Dict[str, Dict[str, Any]] = {}
    for endpoint in points:
        for server in filter(lambda server: server.measures(endpoint), chosen):
            mine = [run for run in runs if run.server == server.key and run.endpoint == endpoint.key]
            cases[f"{endpoint.key}/{server.key}"] = _case(mine, endpoint.documents)
    trustworthy = args.warmup >= MIN_WARMUP and args.rounds >= MIN_ROUNDS and not args.quick
    return {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": args.command_line,
        "trustworthy": trustworthy,
        "settings": {
            "warmup_s": args.warmup,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "connections": args.connections,
            "workers": args.workers,
            "quick": args.quick,
            "server_env": args.server_env,
            "jetway_env": " ".join(f"{name}={value}" for name, value in jetway_settings(args.server_env)),
        },
        "pinning": plan.description,
        "token": bench.token_source,
        "mismatches": bench.mismatches,
        "machine": machine(PYPY),
        "reference": REFERENCE,
        "servers": [asdict(server) | {"python": str(server.python or "")} for server in chosen],
        "endpoints": [asdict(endpoint) for endpoint in points],
        "cases": cases,
        "worker_rss_mb": bench.worker_rss_mb,
        "fresh_rss_mb": bench.fresh_rss_mb,
        "rss_seconds": args.rss_seconds,
        "runs": [asdict(run) for run in runs],
    }


def _case(runs: List[Run], documents: int) -> Dict[str, Any]:
    rps = [run.rps for run in runs]
    p99 = [run.p99_ms for run in runs]
    return {
        "rps": statistics.mean(rps) if rps else 0.0,
        "documents_per_s": statistics.mean(rps) * documents if rps else 0.0,
        "rps_min": min(rps, default=0.0),
        "rps_max": max(rps, default=0.0),
        "p99_ms": statistics.mean(p99) if p99 else 0.0,
        "p99_min": min(p99, default=0.0),
        "p99_max": max(p99, default=0.0),
        "errors": sum(run.errors for run in runs),
        "runs": len(runs),
        "bytes_per_request": statistics.mean(run.bytes_per_request for run in runs) if runs else 0.0,
    }


def _parser() -> argparse.ArgumentParser:
    def env(name: str, default: Any) -> Any:
        return type(default)(os.environ.get(f"BENCH_{name}", default))

    all_servers = ",".join(server.key for server in servers(1))
    # A replica changes every server's writes: only when asked for (--servers pypy,wait1).
    usual_servers = ",".join(server.key for server in servers(1) if not server.needs_replica)
    all_endpoints = ",".join(endpoint.key for endpoint in endpoints(1, 1024))
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=float, default=env("WARMUP", 25.0), help="s of load per server first (≥15)")
    parser.add_argument("--duration", type=float, default=env("DURATION", 10.0), help="s per measurement")
    parser.add_argument("--rounds", type=int, default=env("ROUNDS", 2), help="measurements of each case (≥2)")
    parser.add_argument("--connections", type=int, default=env("CONNECTIONS", 64), help="wrk -c")
    parser.add_argument("--workers", type=int, default=env("WORKERS", os.cpu_count() or 1), help="N")
    parser.add_argument(
        "--pin", choices=("auto", "off"), default=env("PIN", "off"), help="auto: wrk and the servers on separate cores"
    )
    parser.add_argument("--servers", type=_keys, default=env("SERVERS", usual_servers), help=all_servers)
    parser.add_argument("--endpoints", type=_keys, default=env("ENDPOINTS", all_endpoints), help=all_endpoints)
    parser.add_argument("--small", type=int, default=env("SMALL_BYTES", 200), help="bytes of the small document")
    parser.add_argument("--large", type=int, default=env("LARGE_BYTES", 10240), help="bytes of the large document")
    parser.add_argument(
        "--rss-seconds", type=float, default=env("RSS_SECONDS", 60.0), help="s of the memory run (0: none)"
    )
    parser.add_argument("--pause", type=float, default=env("PAUSE", 0.5), help="s between measurements")
    parser.add_argument(
        "--server-env",
        default=env("SERVER_ENV", ""),
        help="K=V … for the Jetway servers (over the production defaults)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")), help="2 s runs: a smoke test"
    )
    settings = [f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("BENCH_")]
    parser.set_defaults(command_line=" ".join([*settings, "python -m loadtest.bench", *(sys.argv[1:])]))
    return parser


def _keys(text: str) -> List[str]:
    return [key.strip() for key in text.split(",") if key.strip()]
