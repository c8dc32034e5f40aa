"""The worker's CPU cost of one request, without the network, the kernel or a noisy neighbour.

``python -m loadtest.studies._request_path`` (after ``make setup``) starts a private
Redis, makes a token, and then, for each of the four settings of
authorization and access log (on or off), runs a PyPy process that builds a worker exactly
as ``api.worker`` does (``assemble``: the same application, store, hot cache
and gate, connected to that Redis) and feeds requests to one
``JetwayConnection`` over an in-memory transport. Each request is answered
before the next is fed when it needs no Redis: ``/healthz``, and a hot
document read with an unrated token (a hit of the hot cache, its token
digest known). What is timed is the worker's own code per request, from
the request's bytes to the response's, the access line and its write
included (to ``/dev/null``, every ``--per-turn`` requests, as a reactor turn
ends). A request that had to wait for Redis is counted and left out of the
timing; there should be none.

The figures move far less than a load test's (no scheduler, no wrk, no
kernel buffers), so a change to the request path can be measured in one
run: µs per request, the median of ``--rounds`` rounds after a warm-up that
lets PyPy's JIT compile the path. ``--profile`` runs vmprof over the rounds
of one case and prints the functions that took the most samples themselves
(``pip install vmprof`` into .venv first). The report goes to
``loadtest/results/request_path.md``.

What this leaves out is what a load test adds: reading and writing the
socket, epoll, and the master's relay of the log lines. ``loadtest/ab_cpu.sh``
measures all of it, with the noise. ``--serve SECONDS`` profiles that too:
one worker (``api.worker.run_worker``, on a socket of its own) under wrk
(64 connections, the hot 200 B read or, with ``--serve-method PUT``, a PUT of
it, or with ``--serve-documents N`` reads of N documents in turn, each
setting in turn), vmprof running over the last SECONDS after as long a warm-up.
``--jwt``: the token is a JWT (RS256) of a local issuer (``loadtest/_jwt_issuer.py``)
configured as the worker's one issuer, not one of Jetway's own. With
``JETWAY_TRACING_ENDPOINT`` (and ``JETWAY_TRACING_SAMPLE``) in the environment,
the in-memory worker traces as a served one does (its tracing started as
``listen_on`` starts it): what tracing costs the request path, without a
load test's noise (docs/tracing.md, "What it costs").
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from loadtest._servers import PYPY, ROOT, Processes, free_port, http_ok, wait_until
from loadtest._token import create as make_token

OUTPUT = ROOT / "loadtest" / "results" / "request_path.md"
WRK_SCRIPT = ROOT / "loadtest" / "bench" / "wrk.lua"
DOCUMENT_PATH = "/v1/users/u1"
# A ~200 B document, as the bench's 200 B read.
DOCUMENT = json.dumps(
    {"id": "u1", "name": "Ada Lovelace", "email": "ada@example.com", "tags": ["a", "b", "c"], "bio": "x" * 90}
).encode()
CASES = ("healthz", "get")
# Each case's minor collections per 1,000 requests: on PyPy what a request
# allocates costs more than its own CPU shows (the collections, and the
# nursery it streams through the caches), and a pattern match or a copy
# that allocates shows here when its time alone is within the noise.
MINORS = "_minors"
_KEYS = CASES + tuple(case + MINORS for case in CASES)
SETTINGS = (("off", "off"), ("off", "on"), ("on", "off"), ("on", "on"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.studies._request_path", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=20_000, help="per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=60_000, help="requests before the first round")
    parser.add_argument("--per-turn", type=int, default=4, help="requests per simulated reactor turn")
    parser.add_argument("--only", default="", help="one setting, as auth/log (e.g. on/on)")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="the code to measure (a checkout or worktree; default this one); twice or more: compared, interleaved",
    )
    parser.add_argument("--profile", default="", help="a case to profile with vmprof (healthz or get)")
    parser.add_argument("--serve", type=float, default=0, help="profile a served worker under wrk for this long")
    parser.add_argument("--serve-method", default="GET", choices=("GET", "PUT"), help="what wrk sends with --serve")
    parser.add_argument(
        "--serve-documents",
        type=int,
        default=0,
        help="with --serve: GETs of this many ~200 B documents in turn (the hot cache's miss path), not of one",
    )
    parser.add_argument(
        "--serve-bytes",
        type=int,
        default=0,
        help="with --serve: the one document read (or PUT) is about this long (e.g. 10240), not ~200 B",
    )
    parser.add_argument("--repeat", type=int, default=1, help="processes per tree and setting (medians of them)")
    parser.add_argument("--jwt", action="store_true", help="the token a JWT of a local issuer, not Jetway's own")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _served_child(args) if args.port else _child(args)
    if (args.profile or args.serve) and not _has_vmprof():
        print(f"--profile and --serve need vmprof: {PYPY} -m pip install vmprof", file=sys.stderr)
        return 2
    settings = [tuple(args.only.split("/"))] if args.only else list(SETTINGS)
    with tempfile.TemporaryDirectory(prefix="jetway-request-path-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        if args.serve_documents:
            # Here, not at the top: a child measuring an older --tree imports this module from there.
            from loadtest.studies._hot_cache import seed_documents

            seed_documents(redis_url, args.serve_documents, len(DOCUMENT))
        token = make_token(str(PYPY), redis_url, "request-path")
        if args.jwt:  # the issuer serves its keys from a thread of this process until it ends
            from loadtest._jwt_issuer import Issuer, mint

            issuer = Issuer(Path(scratch) / "issuer").start()
            os.environ["JETWAY_OIDC_ISSUERS"] = str(issuer.directory / "issuers.json")  # the children's
            token = next(mint(issuer.directory, "bench-user", "read:users write:users"))
        trees = [Path(tree).resolve() for tree in args.tree] or [ROOT]
        rows = []
        for auth, log in settings:
            if args.serve:
                print(f"auth {auth:3} log {log:3}: {_profile_served(args, redis_url, token, auth, log, Path(scratch))}")
                continue
            runs: Dict[Path, List[Dict[str, Any]]] = {tree: [] for tree in trees}
            for _ in range(args.repeat):
                for tree in trees:  # interleaved, so that a noisy moment touches each alike
                    runs[tree].append(_run_child(args, redis_url, token, auth, log, tree))
            for tree in trees:
                result = {key: statistics.median(run[key] for run in runs[tree]) for key in _KEYS}
                rows.append((_label(tree), auth, log, result))
                figures = ", ".join(f"{case} {result[case]:.2f} µs ({result[case + MINORS]:.1f})" for case in CASES)
                print(f"{_label(tree)}: auth {auth:3} log {log:3}: {figures}")
                for run in runs[tree]:
                    if run.get("profile"):
                        print(run["profile"])
    if rows:
        _report(rows, args)
    return 0


def _has_vmprof() -> bool:
    found = subprocess.run([str(PYPY), "-c", "import vmprof"], capture_output=True, check=False)
    return found.returncode == 0


def _child_env(redis_url: str, token: str, auth: str, log: str, tree: Path = ROOT) -> Dict[str, str]:
    """A worker's environment, as the master gives it (its GC settings), with these settings."""
    from api.master import DEFAULT_GC_ENVIRONMENT

    return {
        **os.environ,
        **DEFAULT_GC_ENVIRONMENT,
        "REDIS_URL": redis_url,
        "JETWAY_AUTH": auth,
        "JETWAY_ACCESS_LOG": log,
        "JETWAY_TOKEN": token,
        "PYTHONPATH": str(tree),
        # The child feeds requests without turning the reactor, so the hot cache hears no heartbeat between
        # them: with the default lag bound every read after the first 50 ms would go to Redis.
        "JETWAY_HOT_CACHE_MAX_LAG_MS": "3600000",
    }


def _run_child(
    args: argparse.Namespace, redis_url: str, token: str, auth: str, log: str, tree: Path = ROOT
) -> Dict[str, Any]:
    """One measuring process, on the code in ``tree`` (this script runs as a file, so any tree will do)."""
    env = _child_env(redis_url, token, auth, log, tree)
    command = [str(PYPY), __file__, "--child", "--requests", str(args.requests)]
    command += ["--rounds", str(args.rounds), "--warmup", str(args.warmup), "--per-turn", str(args.per_turn)]
    if args.profile:
        command += ["--profile", args.profile]
    done = subprocess.run(command, cwd=tree, env=env, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _profile_served(args: argparse.Namespace, redis_url: str, token: str, auth: str, log: str, scratch: Path) -> str:
    """One worker served under wrk; vmprof over the last ``args.serve`` seconds. Returns the profile."""
    port = free_port()
    result = scratch / f"profile-{auth}-{log}.txt"
    command = [
        str(PYPY),
        "-m",
        "loadtest.studies._request_path",
        "--child",
        "--port",
        str(port),
        "--result",
        str(result),
    ]
    env = _child_env(redis_url, token, auth, log)
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(base + "/healthz"), 30, "the served worker")
        headers = {"Authorization": f"Bearer {token}"} if auth == "on" else {}
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        document = _document_of(args.serve_bytes) if args.serve_bytes else DOCUMENT
        connection.request("PUT", DOCUMENT_PATH, document, {**headers, "Content-Type": "application/json"})
        if connection.getresponse().status not in (200, 201):
            raise RuntimeError("the PUT failed")
        load = ["wrk", "-t1", "-c64", "-s", str(WRK_SCRIPT)] + [f"-H{name}: {value}" for name, value in headers.items()]
        load.append(base + DOCUMENT_PATH)
        body = scratch / "document.json"
        body.write_bytes(document)
        load_env = {**os.environ, "BENCH_METHOD": args.serve_method, "BENCH_BODY_FILE": str(body)}
        if args.serve_documents:
            from loadtest.studies._hot_cache import SEEDED_PREFIX

            load_env.update(BENCH_IDS=str(args.serve_documents), BENCH_PATH_PREFIX=SEEDED_PREFIX)
        warm_up = subprocess.run([*load, f"-d{args.serve:g}s"], env=load_env, check=True, stdout=subprocess.DEVNULL)
        warm_up.check_returncode()  # the JIT's warm-up
        os.kill(worker.pid, signal.SIGUSR1)  # vmprof on
        measured = subprocess.run(
            [*load, f"-d{args.serve:g}s"], env=load_env, check=True, stdout=subprocess.PIPE, text=True
        )
        rate = next(line for line in measured.stdout.splitlines() if line.startswith("Requests/sec"))
        worker.terminate()
        worker.wait(60)
        return f"{rate.strip()}\n{result.read_text()}"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _document_of(size: int) -> bytes:
    """``DOCUMENT`` with its ``bio`` grown to make it ``size`` bytes long (at least its own length)."""
    padding = max(0, size - len(DOCUMENT))
    return json.dumps({**json.loads(DOCUMENT), "bio": "x" * (90 + padding)}).encode()


def _served_child(args: argparse.Namespace) -> int:
    """A worker on a listening socket of its own; SIGUSR1 starts vmprof, the drain's end reports it."""
    from api import event_loop

    reactor = event_loop.install()
    from api.config import from_environment
    from api.sockets import bind_listeners
    from api.worker import run_worker

    listener = bind_listeners("127.0.0.1", args.port, 1)[0]
    profiler: List[_Profiler] = []
    signal.signal(signal.SIGUSR1, lambda *_: profiler.append(_Profiler()))
    code = run_worker(from_environment(), reactor, os.dup(listener.fileno()))
    listener.close()
    Path(args.result).write_text(profiler[0].stop_and_report(40) if profiler else "no profile: SIGUSR1 never came")
    return code


def _label(tree: Path) -> str:
    """A tree as its commit (and ``+`` when it has changes not committed)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    status = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=tree, capture_output=True, text=True)
    return head.stdout.strip() + ("+" if status.stdout.strip() else "")


def _report(rows: List[Any], args: argparse.Namespace) -> None:
    lines = [
        "# The worker's CPU per request, in-process (`python -m loadtest.studies._request_path`)",
        "",
        f"Median of {args.rounds} rounds of {args.requests:,} requests after {args.warmup:,}, in each of "
        f"{args.repeat} process(es) per row (the median of theirs); the access log written every "
        f"{args.per_turn} requests.",
        "",
        "Minor collections: PyPy's, per 1,000 requests (the nursery as the master sets it), a measure of "
        "what a request allocates.",
        "",
        "| code | authorization | access log | /healthz µs | minor collections "
        "| 200 B read (hot) µs | minor collections |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {code} | {auth} | {log} | {r['healthz']:.2f} | {r['healthz' + MINORS]:.1f} "
        f"| {r['get']:.2f} | {r['get' + MINORS]:.1f} |"
        for code, auth, log, r in rows
    ]
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text("\n".join(lines) + "\n")
    print(f"report: {OUTPUT.relative_to(ROOT)}")


# The measuring process (PyPy): a worker built in-process, fed by hand.


def _child(args: argparse.Namespace) -> int:
    from api import event_loop

    reactor = event_loop.install()
    from api.config import from_environment
    from api.log_writer import LineWriter
    from api.observe import Metrics
    from api.worker import assemble

    settings = from_environment()
    metrics = Metrics()
    devnull = os.open(os.devnull, os.O_WRONLY)
    lines = LineWriter(devnull, False, metrics.count_dropped_lines)
    app, _ = assemble(settings, reactor, metrics, lines)
    if app.start_tracing is not None:  # JETWAY_TRACING_ENDPOINT set: started as listen_on starts it
        app.tracing = app.start_tracing()
    token = os.environ.get("JETWAY_TOKEN", "") if settings.auth else ""
    result: Dict[str, Any] = {}

    def finish(outcome: Any) -> None:
        if isinstance(outcome, Exception) or hasattr(outcome, "getTraceback"):
            print(getattr(outcome, "getTraceback", lambda: outcome)(), file=sys.stderr)
            result["error"] = True
        reactor.stop()

    reactor.callWhenRunning(lambda: _drive(reactor, app, token, args, result).addBoth(finish))
    reactor.run()
    if result.get("error"):
        return 1
    print(json.dumps(result))
    return 0


def _drive(reactor: Any, app: Any, token: str, args: argparse.Namespace, result: Dict[str, Any]) -> Any:
    from twisted.internet import defer, task
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    minors = [0]

    def count_minors(stats: Any) -> None:
        minors[0] += stats.count

    gc.hooks.on_gc_minor = count_minors  # PyPy's; the child always runs on PyPy
    connection = app.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    connection.makeConnection(transport)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = f"Host: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n{auth}"
    requests = {
        "healthz": f"GET /healthz HTTP/1.1\r\n{head}\r\n".encode(),
        "get": f"GET {DOCUMENT_PATH} HTTP/1.1\r\n{head}\r\n".encode(),
    }
    body_head = f"Content-Type: application/json\r\nContent-Length: {len(DOCUMENT)}\r\n"
    put = f"PUT {DOCUMENT_PATH} HTTP/1.1\r\n{head}{body_head}\r\n"

    def end_of_poll() -> None:
        """What the reactor does as a poll's events are done and the next turn starts: the access lines written."""
        getattr(reactor, "polled", lambda: None)()  # a reactor from before after_each_poll has none
        reactor.runUntilCurrent()

    @defer.inlineCallbacks
    def answered(request: bytes) -> Any:
        """Send one request and wait for its whole response; True when it came at once."""
        transport.clear()
        connection.dataReceived(request)
        waited = False
        while not _whole_response(transport.value()):
            waited = True
            yield task.deferLater(reactor, 0.001, lambda: None)
        return not waited

    def one_round(request: bytes) -> float:
        """``args.requests`` requests, each answered before the next; µs per request."""
        waited = 0
        started = time.perf_counter()
        for number in range(args.requests):
            transport.clear()
            connection.dataReceived(request)
            if not transport.value():
                waited += 1
            if number % args.per_turn == 0:
                end_of_poll()
        took = (time.perf_counter() - started) / args.requests * 1e6
        if waited:
            raise RuntimeError(f"{waited} requests waited for Redis: not the in-memory path")
        return took

    @defer.inlineCallbacks
    def rounds(request: bytes, count: int) -> Any:
        took = []
        for _ in range(count):
            took.append(one_round(request))
            # The reactor reads its sockets between rounds (the rounds never
            # poll): a Redis connection's health check would time out otherwise.
            yield task.deferLater(reactor, 0.001, lambda: None)
        return took

    @defer.inlineCallbacks
    def run() -> Any:
        for _ in range(500):  # a JWT's issuer's keys are fetched as the worker starts: 503 until they come
            yield answered(put.encode() + DOCUMENT)
            if b" 503 " not in transport.value()[:16]:
                break
            yield task.deferLater(reactor, 0.01, lambda: None)
        if b" 20" not in transport.value()[:16]:
            raise RuntimeError(f"the PUT failed: {transport.value()[:300]!r}")
        for case, request in requests.items():
            # Until the answers come at once (the token's digest and the document cached).
            for _ in range(1000):
                at_once = yield answered(request)
                if at_once:
                    break
            if b" 200 " not in transport.value()[:16]:
                raise RuntimeError(f"{case}: {transport.value()[:300]!r}")
            yield rounds(request, max(1, args.warmup // args.requests))  # the JIT's warm-up
            profiler = _Profiler() if args.profile == case else None
            minors_before = minors[0]
            took = yield rounds(request, args.rounds)
            result[case] = statistics.median(took)
            result[case + MINORS] = (minors[0] - minors_before) * 1000 / (args.rounds * args.requests)
            if profiler is not None:
                result["profile"] = profiler.stop_and_report()
            yield task.deferLater(reactor, 0.01, lambda: None)

    return run()


def _whole_response(data: bytes) -> bool:
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    for line in data[:end].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(data) >= end + 4 + int(line.split(b":")[1])
    return True


class _Profiler:
    """vmprof over the rounds of one case, reported as the functions with the most samples of their own."""

    PERIOD = 0.0002

    def __init__(self) -> None:
        import vmprof

        self.path = Path(tempfile.mkstemp(suffix=".vmprof")[1])
        self.file = self.path.open("w+b")
        vmprof.enable(self.file.fileno(), period=self.PERIOD)

    def stop_and_report(self, top: int = 30) -> str:
        import vmprof

        vmprof.disable()
        self.file.close()
        stats = vmprof.read_profile(str(self.path))
        self.path.unlink()
        own: Dict[str, int] = {}
        inclusive: Dict[str, int] = {}
        total = _walk(stats.get_tree(), own, inclusive, set())
        rows = sorted(own.items(), key=lambda item: -item[1])[:top]
        text = [f"{total} samples; own % / inclusive % / function"]
        text += [f"{100 * n / total:5.1f} {100 * inclusive[name] / total:5.1f}  {name}" for name, n in rows]
        return "\n".join(text)


def _walk(node: Any, own: Dict[str, int], inclusive: Dict[str, int], above: set) -> int:
    name = _short(node.name)
    children = list(node.children.values())
    own[name] = own.get(name, 0) + node.count - sum(child.count for child in children)
    if name not in above:  # a recursive call is counted once in its caller's inclusive figure
        inclusive[name] = inclusive.get(name, 0) + node.count
    for child in children:
        _walk(child, own, inclusive, above | {name})
    return node.count


def _short(name: str) -> str:
    """``py:function:line:/path/to/file.py`` as ``function file.py:line``."""
    parts = name.split(":")
    if len(parts) >= 4 and parts[0] == "py":
        path = parts[3]
        for marker in ("site-packages/", str(ROOT) + "/"):
            if marker in path:
                path = path.split(marker, 1)[1]
        return f"{parts[1]} {path}:{parts[2]}"
    return name


if __name__ == "__main__":
    sys.exit(main())
