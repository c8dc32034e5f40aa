"""Issue 59's count figure: ``Prefer: count=exact`` over 1,000,000 matching documents, in Redis's time.

One served worker (``loadtest.studies._served``: production defaults,
authorization and the access log on) and a private Redis. ``--documents``
documents (~60 B each: ``team`` "a", ``created`` its number) are imported
into a collection that declares ``by_team_created`` (team, created) first,
so every write keeps the index. Then, for each count asked:

- over HTTP, the page's ``Content-Range`` is checked to hold the total;
- the count's own scripts (``cache.indexes.counts``, the 16 shards' commands
  exactly as the worker builds them) are run ``--repeats`` times from here
  after ``CONFIG RESETSTAT``: Redis's time per count is ``INFO
  commandstats``' ``usec`` of ``EVALSHA`` over the repeats (the 16 scripts
  of one count summed), beside ``ZLEXCOUNT``'s and ``ZCARD``'s own;
- the request's latency with and without the count, medians of
  ``--repeats`` each, interleaved.

The counts: ``team=eq.a`` (every document), ``team=eq.a&created=gte.<half>``
(half), ``team=in.(a,b)`` (two ranges), the same with a cursor in the
middle (the entries before it counted too), and the list (``ZCARD``).

Writes ``loadtest/results/counts.md`` (appended).

    .venv/bin/python -m loadtest.studies._counts [--documents 1000000] [--repeats 200]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis
from twisted.internet import defer

from cache.indexes import counts
from cache.indexes.declared import declared_indexes
from cache.indexes.queries import plan
from loadtest import _token
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._bulk import import_stream
from loadtest.studies._served import append_report, serve_one

REPORT = ROOT / "loadtest" / "results" / "counts.md"
COLLECTION = "counted"
INDEXES = {
    "by_team_created": {
        "fields": [
            {"name": "team", "pointer": "/team", "type": "string"},
            {"name": "created", "pointer": "/created", "type": "number"},
        ]
    }
}
BLOCK = 100_000


class _Recorded:
    """A link that keeps the commands it is given (the count's, as the worker would send them) and sends none."""

    def __init__(self) -> None:
        self.commands: List[Sequence[Any]] = []

    def pipeline_outcomes(self, commands: Sequence[Sequence[Any]], scripts: Any, wait: Any = None) -> defer.Deferred:
        self.commands = list(commands)
        return defer.Deferred()  # never fired: nothing is sent


def count_commands(query: str, cursor: Optional[bytes]) -> List[Sequence[Any]]:
    """The 16 ``EVALSHA`` of the count ``query`` asks (``""``: the list) after ``cursor``, as the worker makes them."""
    link = _Recorded()
    if not query:
        counts.for_list(link, COLLECTION.encode(), cursor)  # type: ignore[arg-type]
    else:
        indexes = declared_indexes(INDEXES)
        arguments: Dict[str, List[str]] = {}
        for part in query.split("&"):
            name, _, value = part.partition("=")
            arguments.setdefault(name, []).append(urllib.request.unquote(value))
        cursor_text = base64.urlsafe_b64encode(cursor).decode().rstrip("=") if cursor else None
        counts.for_query(link, COLLECTION.encode(), plan(indexes, arguments, 1, cursor_text))  # type: ignore[arg-type]
    return link.commands


def get(base: str, path: str, token: str, prefer: Optional[str]) -> Tuple[float, Dict[str, str], bytes]:
    request = urllib.request.Request(base + path)
    request.add_header("Authorization", f"Bearer {token}")
    if prefer:
        request.add_header("Prefer", prefer)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        body = answer.read()
        return time.perf_counter() - started, dict(answer.headers), body


def redis_time(client: redis.Redis, commands: List[Sequence[Any]], repeats: int) -> Dict[str, float]:
    """Redis's usec per count (its 16 scripts), and its ZLEXCOUNT's and ZCARD's, over ``repeats`` counts."""
    from cache.indexes.counts import COUNT

    client.script_load(COUNT.source)
    client.config_resetstat()
    for _ in range(repeats):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        replies = pipe.execute()
    stats = client.info("commandstats")
    per = {
        name: stats.get(f"cmdstat_{name}", {}).get("usec", 0) / repeats for name in ("evalsha", "zlexcount", "zcard")
    }
    per["total"] = sum(reply[1] for reply in replies)
    return per


def declare(python: Path, redis_url: str, scratch: Path) -> None:
    file = scratch / "indexes.json"
    file.write_text(json.dumps(INDEXES))
    subprocess.run(
        [str(python), "-m", "api", "collections", "set", COLLECTION, "--indexes", str(file)],
        cwd=ROOT,
        env={"REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"},
        check=True,
        capture_output=True,
    )
    time.sleep(0.3)


def load(base: str, token: str, documents: int) -> float:
    started = time.perf_counter()
    for start in range(0, documents, BLOCK):
        body = b"".join(
            json.dumps({"id": f"d{n:09d}", "team": "a", "created": n}).encode() + b"\n"
            for n in range(start, min(start + BLOCK, documents))
        )
        result: Dict[str, Any] = {}
        import_stream(base, f"Bearer {token}", body, [0], result, COLLECTION)
        if result.get("status") != "200":
            raise RuntimeError(f"import: {result}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    stop_on_sigterm()
    python, documents, half = Path(sys.executable), args.documents, args.documents // 2
    middle = f"d{half:09d}".encode()
    asked = [
        ("every document: team=eq.a", "team=eq.a", None, documents, 0),
        ("half: team=eq.a&created=gte.<half>", f"team=eq.a&created=gte.{half}", None, documents - half, 0),
        ("two ranges: team=in.(a,b)", "team=in.(a,b)", None, documents, 0),
        # The entry after which the cursor resumes: (created, id) of the middle document, past the in's lead.
        ("the list (ZCARD)", "", None, documents, 0),
        ("the list after a cursor in the middle", "", middle, documents, half + 1),
    ]
    lines = [
        f"`python -m loadtest.studies._counts --documents {documents} --repeats {args.repeats}`: one worker"
        " (production defaults), a private Redis (unix socket), on this machine's 2 shared cores.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="jetway-counts-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        token = _token.resolve(str(python), redis_url).token or ""
        _, base, _ = serve_one(processes, python, redis_url, token, Path(scratch))
        declare(python, redis_url, Path(scratch))
        seconds = load(base, token, documents)
        lines += [f"{documents:,} documents imported with by_team_created declared in {seconds:.1f} s.", ""]
        lines += ["| count | total | Redis µs per count (EVALSHA, 16 scripts) | of it ZLEXCOUNT / ZCARD |"]
        lines += ["| --- | ---: | ---: | ---: |"]
        client = redis.Redis(unix_socket_path=redis_url[len("unix://") :])
        try:
            for label, query, cursor, total, before in asked:
                path = f"/v1/{COLLECTION}?{query}&limit=1"
                if cursor is not None:
                    path += "&cursor=" + base64.urlsafe_b64encode(cursor).decode().rstrip("=")
                _, headers, _ = get(base, path, token, "count=exact")
                wanted = f"{before}-{before}/{total}"
                if headers.get("Content-Range") != wanted:
                    raise RuntimeError(f"{label}: Content-Range {headers.get('Content-Range')}, not {wanted}")
                spent = redis_time(client, count_commands(query, cursor), args.repeats)
                if spent["total"] != total:
                    raise RuntimeError(f"{label}: the scripts counted {spent['total']}, not {total}")
                lines.append(
                    f"| {label} | {total:,} | {spent['evalsha']:.1f} |"
                    f" {spent['zlexcount']:.1f} / {spent['zcard']:.1f} |"
                )
            lines += ["", "HTTP latency of `team=eq.a&limit=1`, medians of the repeats, interleaved:", ""]
            plain, counted = [], []
            for _ in range(args.repeats):
                plain.append(get(base, f"/v1/{COLLECTION}?team=eq.a&limit=1", token, None)[0])
                counted.append(get(base, f"/v1/{COLLECTION}?team=eq.a&limit=1", token, "count=exact")[0])
            lines.append(
                f"- without a count {statistics.median(plain) * 1e3:.2f} ms,"
                f" with `Prefer: count=exact` {statistics.median(counted) * 1e3:.2f} ms"
            )
        finally:
            client.close()
    append_report(REPORT, "Counts (Prefer: count=exact)", "run", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
