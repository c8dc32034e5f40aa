"""Issue 58's figures beside ab_cpu.sh's: reads and pages under the owner rule, and a new JWT's first request.

One served worker (``loadtest.studies._request_path``'s child: production
defaults, authorization and the access log on), a private Redis, and the
local issuer of ``loadtest/_jwt_issuer.py`` as its one OpenID Connect issuer.
The collection ``owned`` has the owner rule (``{"owner": {"pointer":
"/owner"}}``) and ``--documents`` documents of ~200 B, owned by
``--owners`` users in turn, one of them ``bench-user``; ``plain`` has the
same first document and no rule. The cases run under wrk (64 connections,
``fresh_tokens.lua``: each case sends its tokens from a file, one a line, in
turn): every case of the run for ``--warm`` seconds first (the JIT's
warm-up), then each comparison's cases for ``--rounds`` rounds of
``--seconds``, their order reversed every other round. Per case, the median
of the worker's and Redis's CPU per request (from /proc and ``INFO cpu``):

- **tokens**: the read of ``plain`` with bench-user's JWT against the same
  with Jetway's own token;
- **reads**: bench-user's JWT reading its own document, with the rule
  (``/v1/owned/d000000``) against without (``/v1/plain/d000000``);
- **pages**: bench-user's page under the rule (``GET /v1/owned?limit=N``)
  against the same query on the rule's index by Jetway's own token, which
  the rule does not bind (``GET /v1/owned?_owner=eq.bench-user&limit=N``),
  and by a JWT of the same user holding ``admin``, which the rule does not
  bind either (what the JWT costs, apart from the rule);
- **fresh**: the read of ``plain`` with a new JWT on every request (``--tokens``
  of them, RS256 and ES256, cycled: more than the 10,000 a worker keeps
  verified, oldest out first, so none is found) against one JWT repeated.

``--profile CASE`` (``read-jwt``, ``read-opaque``, ``read-rule``, ``read-plain``, ``page-rule``,
``page-index-jwt``, ``page-index``, ``fresh-rs256``, ``fresh-es256``, ``repeated``) then runs
vmprof in the worker over one more run of that case (``.venv/bin/pip install
vmprof``). Writes ``loadtest/results/identity_cost.md`` (appended). It
measures the code of the tree it runs from: run it from a worktree for a
commit's, free of edits not committed.

    .venv/bin/python -m loadtest.studies._identity_cost [--rounds 4] [--seconds 5] [--warm 10] [--only pages]
        [--limit 20] [--documents 10000] [--owners 100] [--tokens 20000] [--profile page-rule]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from loadtest import _token
from loadtest._http import send
from loadtest._jwt_issuer import Issuer, mint
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._attacks import cpu_seconds
from loadtest.studies._bulk import import_stream, redis_cpu_seconds
from loadtest.studies._served import append_report, serve_one

REPORT = ROOT / "loadtest" / "results" / "identity_cost.md"
LUA = Path(__file__).resolve().parent / "fresh_tokens.lua"
USER = "bench-user"
SCOPE = "read:owned write:owned read:plain write:plain"
RULE = {"owner": {"pointer": "/owner"}}
DOCUMENT = {"name": "Ada Lovelace", "email": "ada@example.com", "tags": ["math", "engines"], "score": 97.5}
Case = Tuple[str, Path]  # a path, and the file of the tokens its requests send


class Served:
    """The worker, its Redis and issuer, and the token files of each caller."""

    def __init__(self, processes: Processes, scratch: Path, tokens: int) -> None:
        self.processes, self.scratch = processes, scratch
        self.issuer = Issuer(scratch / "issuer").start()
        self.redis_url = processes.redis()
        self.socket = self.redis_url[len("unix://") :]
        python = str(Path(sys.executable))
        service = _token.resolve(python, self.redis_url).token or ""
        self.admin = _cli_token(python, self.redis_url)
        env = {"JETWAY_OIDC_ISSUERS": str(scratch / "issuer" / "issuers.json")}
        self.worker, self.base, self.profile = serve_one(processes, Path(python), self.redis_url, service, scratch, env)
        self.files = {"service": self._file("service", [service]), "jwt": self._file("jwt", self._mint("RS256", 1))}
        admin = next(mint(self.issuer.directory, USER, "admin", "RS256"))  # a JWT the rule does not bind
        self.files["admin-jwt"] = self._file("admin-jwt", [admin])
        for alg in ("RS256", "ES256"):
            self.files[alg] = self._file(alg, self._mint(alg, tokens))

    def _mint(self, alg: str, count: int) -> List[str]:
        return list(mint(self.issuer.directory, USER, SCOPE, alg, count))

    def _file(self, name: str, tokens: List[str]) -> Path:
        path = self.scratch / f"tokens-{name}.txt"
        path.write_text("\n".join(tokens) + "\n")
        return path

    def request(self, method: str, path: str, token: str, body: Any = None) -> Tuple[int, bytes]:
        return send(self.base, method, path, token, None if body is None else json.dumps(body).encode())

    def token(self, name: str) -> str:
        return self.files[name].read_text().split("\n", 1)[0]

    def wrk(self, case: Case, seconds: float) -> Dict[str, Any]:
        """wrk on ``case``; its summary, with the worker's and Redis's CPU seconds over the run."""
        path, tokens = case
        command = ["wrk", "-t1", "-c64", f"-d{seconds:g}s", "-s", str(LUA), self.base + path]
        worker, redis = cpu_seconds(self.worker.pid), redis_cpu_seconds(self.socket)
        done = subprocess.run(
            command, env={**os.environ, "TOKENS_FILE": str(tokens)}, check=True, capture_output=True, text=True
        )
        requests = int(next(line for line in done.stdout.splitlines() if "requests in" in line).split()[0])
        if "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
            raise RuntimeError(f"wrk {path}: errors\n{done.stdout}")
        return {
            "requests": requests,
            "worker_us": (cpu_seconds(self.worker.pid) - worker) / requests * 1e6,
            "redis_us": (redis_cpu_seconds(self.socket) - redis) / requests * 1e6,
            "rps": requests / seconds,
        }


def _cli_token(python: str, redis_url: str) -> str:
    """A token with the admin scope (collection settings), from the admin CLI."""
    command = [python, "-m", "api", "keys", "create", "--name", "identity-cost", "--scope", "admin"]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "REDIS_URL": redis_url}, capture_output=True, text=True)
    return done.stdout.split()[-1]


def prepare(served: Served, documents: int, owners: int) -> None:
    """``owned`` under the rule with its documents, ``plain`` with its first; once the JWT is accepted."""
    status, body = served.request("PUT", "/v1/_collections/owned", served.admin, RULE)
    assert status in (200, 201), (status, body[:300])
    time.sleep(0.5)  # the worker's settings cache hears of it
    lines = []
    for number in range(documents):
        owner = USER if number % owners == 0 else f"user{number % owners}"
        lines.append(json.dumps({"id": f"d{number:06d}", "owner": owner, **DOCUMENT}).encode())
    result: Dict[str, object] = {}
    import_stream(served.base, f"Bearer {served.admin}", b"\n".join(lines) + b"\n", [0], result, "owned")
    assert result.get("status") == "200", result
    first = json.loads(lines[0])
    assert served.request("PUT", "/v1/plain/d000000", served.admin, first)[0] == 201
    deadline = time.monotonic() + 60
    while served.request("GET", "/v1/owned?limit=1", served.token("jwt"))[0] != 200:  # keys fetched, index built
        if time.monotonic() > deadline:
            raise RuntimeError("the JWT's page never answered 200")
        time.sleep(0.2)


def comparisons(limit: int) -> Dict[str, Dict[str, Tuple[str, str]]]:
    """Each comparison's cases: name -> (path, the token file's name)."""
    return {
        "tokens": {
            "read-jwt": ("/v1/plain/d000000", "jwt"),
            "read-opaque": ("/v1/plain/d000000", "service"),
        },
        "reads": {
            "read-rule": ("/v1/owned/d000000", "jwt"),
            "read-plain": ("/v1/plain/d000000", "jwt"),
        },
        "pages": {
            "page-rule": (f"/v1/owned?limit={limit}", "jwt"),
            "page-index-jwt": (f"/v1/owned?_owner=eq.{USER}&limit={limit}", "admin-jwt"),
            "page-index": (f"/v1/owned?_owner=eq.{USER}&limit={limit}", "service"),
        },
        "fresh": {
            "fresh-rs256": ("/v1/plain/d000000", "RS256"),
            "fresh-es256": ("/v1/plain/d000000", "ES256"),
            "repeated": ("/v1/plain/d000000", "jwt"),
        },
    }


def check_pages(served: Served, limit: int) -> int:
    """The two page cases answer the same documents (bench-user's, in id order); how many."""
    cases = comparisons(limit)["pages"]
    answers = [served.request("GET", path, served.token(file)) for path, file in cases.values()]
    assert all(status == 200 for status, _ in answers), answers
    items = [[item["id"] for item in json.loads(body)["items"]] for _, body in answers]
    assert all(found == items[0] for found in items), items
    return len(items[0])


def measure(served: Served, cases: Dict[str, Tuple[str, str]], rounds: int, seconds: float) -> List[str]:
    named = {name: (path, served.files[file]) for name, (path, file) in cases.items()}
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in named}
    for number in range(rounds):
        for name in named if number % 2 == 0 else reversed(list(named)):
            runs[name].append(served.wrk(named[name], seconds))
    first = list(named)[-1]  # the reference: the last case
    lines = [
        "| case | path | worker µs/request (rounds) | median | / the last | Redis µs | req/s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, rs in runs.items():
        worker = statistics.median(r["worker_us"] for r in rs)
        reference = statistics.median(r["worker_us"] for r in runs[first])
        each = ", ".join(f"{r['worker_us']:.1f}" for r in rs)
        lines.append(
            f"| {name} | `{named[name][0]}` | {each} | **{worker:.1f}** | {worker / reference:.2f}x"
            f" | {statistics.median(r['redis_us'] for r in rs):.1f} | {statistics.median(r['rps'] for r in rs):,.0f} |"
        )
    return lines


def profile(served: Served, case: Case, seconds: float) -> str:
    """vmprof in the worker over one run of ``case``; the worker stops after (its profile is written then)."""
    served.wrk(case, seconds)
    os.kill(served.worker.pid, signal.SIGUSR1)
    run = served.wrk(case, seconds)
    served.processes.stop(served.worker)
    return f"{run['worker_us']:.1f} µs/request under vmprof\n\n```\n{served.profile.read_text()}\n```"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--warm", type=float, default=10, help="seconds of each case before the rounds")
    parser.add_argument("--limit", type=int, default=20, help="the pages' size")
    parser.add_argument("--documents", type=int, default=10_000)
    parser.add_argument("--owners", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=20_000, help="fresh tokens per algorithm, cycled")
    parser.add_argument("--only", choices=tuple(comparisons(0)), action="append", help="these comparisons")
    parser.add_argument("--profile", default="", help="a case to profile after the rounds")
    args = parser.parse_args()
    stop_on_sigterm()
    lines = [
        f"`python -m loadtest.studies._identity_cost {' '.join(sys.argv[1:])}`: one worker (production defaults),"
        f" a private Redis, wrk -c64; {args.documents:,} documents of {args.owners} owners; load average"
        f" {os.getloadavg()[0]:.1f} at the start.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="jetway-identity-") as scratch, Processes(Path(scratch)) as processes:
        fresh = not args.only or "fresh" in args.only
        served = Served(processes, Path(scratch), args.tokens if fresh else 1)
        try:
            prepare(served, args.documents, args.owners)
            found = check_pages(served, args.limit)
            chosen = {name: c for name, c in comparisons(args.limit).items() if not args.only or name in args.only}
            for path, file in [case for cases in chosen.values() for case in cases.values()]:
                served.wrk((path, served.files[file]), args.warm)  # the JIT's warm-up, of all before any is measured
            for name, cases in chosen.items():
                lines += [f"### {name}" + (f" ({found} documents a page)" if name == "pages" else ""), ""]
                lines += [*measure(served, cases, args.rounds, args.seconds), ""]
            if args.profile:
                path, file = {k: v for c in comparisons(args.limit).values() for k, v in c.items()}[args.profile]
                lines += [f"### vmprof: {args.profile}", "", profile(served, (path, served.files[file]), args.seconds)]
        finally:
            served.issuer.stop()
    lines.append(f"Load average at the end: {os.getloadavg()[0]:.1f}.")
    append_report(REPORT, "What identity costs (issue 58)", "run", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
