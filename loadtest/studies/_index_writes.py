"""What declared indexes cost a write in Redis: the write scripts alone, no worker, side by side.

A private Redis and the real scripts (``cache.documents.scripts``' PUT and
WRITE_MANY), called with the arguments a worker sends (``index_args``, the
change feed's ``script_parts``): PUTs of ~200 B documents to fresh ids into a
collection with three indexes (a string, a number, a compound, as
``loadtest.studies._queries`` declares) against one with none, single and in
batches of 100, interleaved for ``--rounds`` rounds of ``--documents`` each,
piped with ``redis-cli --pipe`` (the worker's cost is out of the picture).
Per document: Redis's CPU (``/proc``: its minimum and median over the rounds,
since a shared machine only ever adds to it), and for the last round the
commands' own time beside the scripts' (``INFO commandstats``: commands that
scripts call are counted too), so what is left is the cost of Lua and of each
``redis.call``. Writes ``loadtest/results/index_writes.md``.

    .venv/bin/python -m loadtest.studies._index_writes [--documents 20000] [--rounds 5] [--no-feed]
    .venv/bin/python -m loadtest.studies._index_writes --parts [--documents 20000] [--rounds 5]

``--parts``: where an indexed PUT's Redis time goes. The single PUT's script
as it is, without its index ``ZADD``s (the entries' loop and the hash's
fields kept), and without moving the entries at all (the arguments, the
digest and the hash's read kept), against a PUT into a collection with no
index; the change feed off, so that only the indexes differ.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

from cache import keys
from cache.documents.document import VARIANT_FIELDS
from cache.documents.scripts import PUT, WRITE_MANY
from cache.feed.streams import FeedLog
from cache.indexes.declared import NO_INDEX_ARGS, declared_indexes, index_args, spec_json
from cache.indexes.scripts import SPEC
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._queries import THREE
from loadtest.studies._raw_writes import resp
from loadtest.studies._served import append_report

REPORT = ROOT / "loadtest" / "results" / "index_writes.md"
INDEXES = declared_indexes(THREE)
BATCH = 100


class Writes:
    """The script calls of PUTs to fresh ids, as a worker makes them (fixed ETags and dates: Redis never reads them)."""

    def __init__(self, feed: bool) -> None:
        self.feed = FeedLog(enabled=feed)
        self.numbers: Iterator[int] = itertools.count()

    def put(self, collection: bytes, indexed: bool) -> Tuple[List[bytes], List[Any]]:
        n = next(self.numbers)
        document = {"email": f"b{n}@x.example", "created": n, "team": f"t{n % 7}", "pad": "x" * 140}
        doc_id = b"d%d" % n
        shard = keys.shard_of(doc_id)
        feed_keys, feed_args = self.feed.script_parts(b"put", collection, shard)
        entries = index_args(INDEXES, document, doc_id) if indexed else NO_INDEX_ARGS
        head = [doc_id, json.dumps(document).encode(), b'"e%d"' % n, b"Sun, 29 Nov 2026 12:00:00 GMT", b"0", b"", b""]
        args = [*head, 0, *entries, *VARIANT_FIELDS, *feed_args]
        return [*keys.document_and_index_keys(collection, doc_id, shard), *feed_keys], args

    def singles(self, collection: bytes, indexed: bool, count: int) -> bytes:
        calls = (self.put(collection, indexed) for _ in range(count))
        return b"".join(resp([b"EVALSHA", PUT.sha, len(k), *k, *a]) for k, a in calls)

    def batches(self, collection: bytes, indexed: bool, count: int) -> bytes:
        out = []
        for _ in range(count // BATCH):
            all_keys: List[bytes] = []
            all_args: List[Any] = [0]
            for _ in range(BATCH):
                write_keys, args = self.put(collection, indexed)
                all_keys += write_keys
                all_args += [b"p", len(args), *args]
                all_args[0] = len(write_keys)
            out.append(resp([b"EVALSHA", WRITE_MANY.sha, len(all_keys), *all_keys, *all_args]))
        return b"".join(out)


class PrivateRedis:
    """redis-cli against the study's Redis, and that Redis's CPU seconds so far."""

    def __init__(self, processes: Processes) -> None:
        self.socket = processes.redis()[len("unix://") :]
        self.pid = processes.named["redis"].pid

    def cli(self, *command: str, data: bytes = b"") -> bytes:
        command_line = ["redis-cli", "-s", self.socket, *command]
        return subprocess.run(command_line, input=data, capture_output=True, check=True).stdout

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def pipe(self, data: bytes) -> None:
        said = self.cli("--pipe", data=data).decode()
        if "errors: 0," not in said:
            raise RuntimeError(f"the scripts answered errors: {said.strip().splitlines()[-1]}")

    def commands(self, documents: int) -> str:
        """The heaviest commands since the last reset, per document: calls and µs (scripts' commands included)."""
        found = re.findall(r"cmdstat_(\w+):calls=(\d+),usec=(\d+)", self.cli("INFO", "commandstats").decode())
        rows = sorted(((int(usec), name, int(calls)) for name, calls, usec in found), reverse=True)
        each = (f"{name} {calls / documents:.2f} calls {usec / documents:.1f} µs" for usec, name, calls in rows[:8])
        return "; ".join(each)


# The PUT script's lines that --parts takes out (cache.documents.scripts, cache.indexes.scripts' move_entries).
_INDEX_ZADD = "if entry then redis.call('ZADD', itag .. field, '0', entry) end"
_MOVE_ENTRIES = "if indexed then marks = make_rare().move_entries(itag, indexed, held, 1, sets, dels, K[3] ~= nil) end"


def parts(redis: PrivateRedis, documents: int, rounds: int) -> List[str]:
    """Redis's CPU per document of the PUT script and of its variants without parts of the index work."""
    source = PUT.source.decode()
    if _INDEX_ZADD not in source or _MOVE_ENTRIES not in source:
        raise RuntimeError("the PUT script changed: --parts no longer finds the lines it takes out")
    variants = {
        "PUT, three indexes": (source, True),
        "without its index ZADDs": (source.replace(_INDEX_ZADD, "if entry then local _ = itag .. field end"), True),
        "without moving the entries": (source.replace(_MOVE_ENTRIES, ""), True),
        "PUT, no index": (source, False),
    }
    shas = {name: redis.cli("SCRIPT", "LOAD", text).decode().strip() for name, (text, _) in variants.items()}
    writes = Writes(feed=False)
    cpu: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (_, indexed) in variants.items():
            calls = (writes.put(b"indexed" if indexed else b"plain", indexed) for _ in range(documents))
            data = b"".join(resp([b"EVALSHA", shas[name], len(k), *k, *a]) for k, a in calls)
            before = redis.cpu_seconds()
            redis.pipe(data)
            cpu[name].append((redis.cpu_seconds() - before) / documents * 1e6)
    return [
        f"`python -m loadtest.studies._index_writes --parts --documents {documents} --rounds {rounds}`: the single"
        " PUT's script and variants of it on a private Redis, change feed off.",
        "",
        "| | Redis CPU µs/document, min | median |",
        "|---|---:|---:|",
        *(f"| {name} | {min(v):.1f} | {statistics.median(v):.1f} |" for name, v in cpu.items()),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=20_000, help="per case and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-feed", action="store_true", help="with the change feed off (JETWAY_FEED=off)")
    parser.add_argument("--parts", action="store_true", help="where an indexed PUT's Redis time goes")
    args = parser.parse_args()
    stop_on_sigterm()
    writes = Writes(feed=not args.no_feed)
    count = args.documents // BATCH * BATCH
    cases: Dict[str, Callable[[], bytes]] = {
        "single PUT, no index": lambda: writes.singles(b"plain", False, count),
        "single PUT, three indexes": lambda: writes.singles(b"indexed", True, count),
        "batch of 100, no index": lambda: writes.batches(b"plain", False, count),
        "batch of 100, three indexes": lambda: writes.batches(b"indexed", True, count),
    }
    cpu: Dict[str, List[float]] = {name: [] for name in cases}
    commands: Dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="jetway-index-writes-") as scratch, Processes(Path(scratch)) as processes:
        redis = PrivateRedis(processes)
        for shard in range(keys.INDEX_SHARDS):
            spec_key = keys.index_spec_key(b"indexed", shard).decode()
            redis.cli("EVAL", SPEC.source.decode(), "1", spec_key, "1", spec_json(INDEXES).decode())
        for script in (PUT, WRITE_MANY):
            redis.cli("SCRIPT", "LOAD", script.source.decode())
        if args.parts:
            found = parts(redis, count, args.rounds)
            append_report(REPORT, "What declared indexes cost a write in Redis", "parts", found)
            return 0
        for number in range(args.rounds):
            for name in cases if number % 2 == 0 else reversed(list(cases)):
                data = cases[name]()
                redis.cli("CONFIG", "RESETSTAT")
                before = redis.cpu_seconds()
                redis.pipe(data)
                cpu[name].append((redis.cpu_seconds() - before) / count * 1e6)
                commands[name] = redis.commands(count)
    feed = "off" if args.no_feed else "on"

    def ratio(indexed: str, plain: str, pick: Callable[[List[float]], float]) -> str:
        return f"{pick(cpu[plain]) / pick(cpu[indexed]):.2f}x"

    lines = [
        f"`python -m loadtest.studies._index_writes --documents {args.documents} --rounds {args.rounds}"
        f"{' --no-feed' if args.no_feed else ''}`: the write scripts alone on a private Redis, change feed {feed}.",
        "",
        "| | Redis CPU µs/document, min | median | rounds |",
        "|---|---:|---:|---|",
        *(
            f"| {name} | {min(v):.1f} | {statistics.median(v):.1f} | {', '.join(f'{x:.1f}' for x in v)} |"
            for name, v in cpu.items()
        ),
        "",
        "None / three (Redis CPU per document; 1.00x: indexes cost nothing): single PUTs"
        f" {ratio('single PUT, three indexes', 'single PUT, no index', min)} by minimum,"
        f" {ratio('single PUT, three indexes', 'single PUT, no index', statistics.median)} by median; batches"
        f" {ratio('batch of 100, three indexes', 'batch of 100, no index', min)} by minimum,"
        f" {ratio('batch of 100, three indexes', 'batch of 100, no index', statistics.median)} by median.",
        "",
        "The last round's commands per document (`INFO commandstats`, wall µs: `evalsha` is the whole script,"
        " the others the commands it called):",
        "",
        *(f"- {name}: {said}" for name, said in commands.items()),
    ]
    append_report(REPORT, "What declared indexes cost a write in Redis", "run", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
