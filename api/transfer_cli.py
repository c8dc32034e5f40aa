"""``python -m api import|export``: a collection loaded from, or dumped to, an NDJSON file, over HTTP.

A client of a running Jetway (``--url``, else ``JETWAY_URL``, else
http://127.0.0.1:8080; ``--token``, else ``JETWAY_TOKEN``), through its
streamed endpoints (``POST /v1/_import/{coll}``, ``GET /v1/{coll}`` as
NDJSON), with a progress bar (tqdm, on stderr) and a summary at the end.

``export COLL [FILE]`` writes ``{"id":"<id>","doc":<stored bytes>}`` lines
(``with_ids=1``) in id order; ``--resume`` cuts FILE after its last whole
line and goes on after that line's id: the file is its own state.
``import COLL FILE --with-ids`` reads such a file back, each document's
bytes as they were stored. An import sends its lines under an
``Idempotency-Key`` kept in ``FILE.jetway-import`` until the server has
answered: ``--resume`` sends the file again under the same key and the
server skips the lines it had written (its acknowledged ``last_line``),
so each document is written once. Refused lines, with their line number
and problem, go to ``--refused FILE`` (the server lists the first 1,000).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import sys
import time
import uuid
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlencode, urlsplit

BLOCK = 64 * 1024
STATE_SUFFIX = ".jetway-import"
NDJSON = "application/x-ndjson"
COUNT_HEADER = "X-Jetway-Documents"
# How long an import retries while its key is held: an import that died holds it until its lease runs out
# (cache.documents.import_progress.LEASE_SECONDS, 15 s).
KEY_BUSY_SECONDS = 30
# Refusals of an import's head, before any line is read (an answer with no report of lines written).
REFUSED_AT_HEAD = (400, 401, 403, 404, 415)


class TransferError(Exception):
    """What stops an import or export, said to the user."""


def add_parsers(commands: Any) -> None:
    importing = commands.add_parser("import", help="write a collection's documents from an NDJSON file")
    importing.add_argument("collection")
    importing.add_argument("file", help="the NDJSON file, or - for stdin")
    ids = importing.add_mutually_exclusive_group()
    ids.add_argument("--with-ids", action="store_true", help='lines are {"id": ..., "doc": ...}, as export writes')
    ids.add_argument("--id", dest="pointer", help="a JSON Pointer to each line's id, e.g. /id")
    ids.add_argument("--id-field", help="each line's id is this top-level member")
    importing.add_argument("--refused", help="write the refused lines (number, problem, text) here, as NDJSON")
    importing.add_argument("--resume", action="store_true", help="go on with an interrupted import of FILE")
    exporting = commands.add_parser("export", help="write a collection's documents to an NDJSON file")
    exporting.add_argument("collection")
    exporting.add_argument("file", nargs="?", default="-", help="the file to write, or - for stdout (the default)")
    exporting.add_argument("--resume", action="store_true", help="go on after the last whole line of FILE")
    for parser in (importing, exporting):
        parser.add_argument("--url", default=os.environ.get("JETWAY_URL", "http://127.0.0.1:8080"))
        parser.add_argument("--token", default=os.environ.get("JETWAY_TOKEN"), help="(else JETWAY_TOKEN)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        if args.command == "import":
            return run_import(args)
        return run_export(args)
    except TransferError as error:
        print(f"jetway: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\njetway: interrupted; the same command with --resume goes on ({args.command})", file=sys.stderr)
        return 130


# -- the connection ------------------------------------------------------------


def connect(url: str) -> Tuple[http.client.HTTPConnection, str]:
    """A connection to the server at ``url``, and the path prefix under it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransferError(f"--url must be http(s)://host[:port], not {url!r}")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname, parts.port, timeout=300), parts.path.rstrip("/")


def headers(args: argparse.Namespace, **more: str) -> Dict[str, str]:
    found = {name.replace("_", "-"): value for name, value in more.items()}
    if args.token:
        found["Authorization"] = "Bearer " + args.token
    return found


def problem_text(status: int, body: bytes) -> str:
    try:
        return f"{status}: {json.loads(body)['detail']}"
    except (ValueError, KeyError, TypeError):
        return f"{status}: {body[:200]!r}"


def progress_bar(args: argparse.Namespace, total: Optional[int], what: str, unit: str = "B") -> Any:
    from tqdm import tqdm  # only the transfer commands need it

    scaled = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, unit=unit, desc=what, disable=args.no_progress, smoothing=0.1, **scaled)


class Counter:
    """Documents and bytes seen; the bar counts one of them (its total gives the ETA), the other is beside it."""

    def __init__(self, bar: Any, by_documents: bool = False) -> None:
        self.bar = bar
        self.by_documents = by_documents
        self.documents = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = 0.0

    def add(self, data: bytes) -> None:
        lines = data.count(b"\n")
        self.documents += lines
        self.bytes += len(data)
        self.bar.update(lines if self.by_documents else len(data))
        now = time.monotonic()
        if now - self._shown >= 0.2:
            self._shown = now
            self.show()

    def show(self) -> None:
        beside = f"{self.bytes / 2**20:,.1f} MiB" if self.by_documents else f"{self.documents:,} docs"
        self.bar.set_postfix_str(f"{beside}, {self.rate():,.0f} docs/s", refresh=False)

    def rate(self) -> float:
        return self.documents / max(time.monotonic() - self.started, 1e-6)


# -- import ---------------------------------------------------------------------


def run_import(args: argparse.Namespace) -> int:
    if args.file != "-" and not os.path.isfile(args.file):
        raise TransferError(f"{args.file} is not a file")
    state_path = None if args.file == "-" else args.file + STATE_SUFFIX
    key = import_key(args, state_path)
    query = {"with_ids": "1"} if args.with_ids else {"id": args.pointer} if args.pointer else {}
    if args.id_field:
        query = {"id_field": args.id_field}
    connection, prefix = connect(args.url)
    path = f"{prefix}/v1/_import/{args.collection}" + ("?" + urlencode(query) if query else "")
    busy_until = time.monotonic() + KEY_BUSY_SECONDS
    while True:
        with opened(args.file, "rb") as source:
            size = None if args.file == "-" else os.fstat(source.fileno()).st_size
            with progress_bar(args, size, f"import {args.collection}") as bar:
                counter = Counter(bar)
                reply, body = post_lines(connection, path, _blocks(source, counter), headers(args, Idempotency_Key=key))
        if not key_busy(reply.status, body) or args.file == "-" or time.monotonic() > busy_until:
            break
        # The import cut short still holds the key (it is writing its last lines, or it died and its lease
        # has yet to run out): send again shortly.
        connection.close()
        time.sleep(float(reply.getheader("Retry-After") or 1))
    if reply.status != 200:
        raise TransferError(cut_short(reply.status, body, state_path))
    forget(state_path)
    report = json.loads(body)
    write_refusals(args, report)
    print(import_summary(report, counter), file=sys.stderr)
    return 0 if not report["refused"] else 3


@contextlib.contextmanager
def opened(path: str, mode: str) -> Iterator[IO[bytes]]:
    """FILE, or stdin / stdout for ``-`` (left open)."""
    if path == "-":
        yield sys.stdin.buffer if "r" in mode else sys.stdout.buffer
        return
    with open(path, mode) as file:
        yield file


def post_lines(
    connection: http.client.HTTPConnection, path: str, blocks: Iterator[bytes], sent: Dict[str, str]
) -> Tuple[http.client.HTTPResponse, bytes]:
    """The import's answer: its status and body."""
    # A body of unknown length: http.client sends it chunked. A refusal at
    # the head may come while it is sent: then the answer says why.
    with contextlib.suppress(OSError):
        connection.request("POST", path, body=blocks, headers={**sent, "Content-Type": NDJSON})
    try:
        reply = connection.getresponse()
        return reply, reply.read()
    except (OSError, http.client.HTTPException) as error:
        raise TransferError(f"the import was cut short ({error!r}); --resume goes on where it stopped") from None


def import_key(args: argparse.Namespace, state_path: Optional[str]) -> str:
    """The import's Idempotency-Key: a new one kept in the state file, or, with ``--resume``, the kept one."""
    if state_path is None:
        if args.resume:
            raise TransferError("--resume needs a FILE, not stdin")
        return "import-" + uuid.uuid4().hex
    if args.resume:
        try:
            with open(state_path) as kept:
                state = json.load(kept)
        except (OSError, ValueError) as error:
            raise TransferError(f"nothing to resume: {state_path} cannot be read ({error})") from None
        if state.get("collection") != args.collection:
            raise TransferError(f"{state_path} is an import into {state.get('collection')!r}, not {args.collection!r}")
        return str(state["key"])
    if os.path.exists(state_path):
        raise TransferError(f"an import of {args.file} was interrupted: add --resume to go on, or remove {state_path}")
    key = "import-" + uuid.uuid4().hex
    with open(state_path, "w") as state:
        json.dump({"collection": args.collection, "url": args.url, "key": key, "started": time.time()}, state)
    return key


def key_busy(status: int, body: bytes) -> bool:
    """The answer is a 409 ``idempotency-key-in-use``: another import runs under the key."""
    return status == 409 and b"idempotency-key-in-use" in body


def cut_short(status: int, body: bytes, state_path: Optional[str]) -> str:
    """What to tell of an import answered with an error; its state is forgotten only if it wrote nothing.

    An import that ended early answers with what it wrote (``written``,
    ``last_line``, ``resume_from_line``): the state file is kept so that
    ``--resume`` goes on after it. An answer without that report is a
    refusal before any line was read.
    """
    text = f"the server refused the import: {problem_text(status, body)}"
    try:
        report = json.loads(body)
        written, last_line = int(report["written"]), int(report["last_line"])
    except (ValueError, KeyError, TypeError):
        if status in REFUSED_AT_HEAD:
            forget(state_path)  # nothing was read, so nothing to resume
        return text
    text += f"\n{written:,} documents were written, up to line {last_line:,}"
    if state_path is None:
        return text + f"; the same import from line {last_line + 1} on goes on (?from_line={last_line + 1})"
    return text + "; the same command with --resume goes on after it"


def forget(state_path: Optional[str]) -> None:
    if state_path is not None and os.path.exists(state_path):
        os.remove(state_path)


def _blocks(source: IO[bytes], counter: Counter) -> Iterator[bytes]:
    while True:
        data = source.read(BLOCK)
        if not data:
            counter.show()  # the bar's last line says it all
            return
        counter.add(data)
        yield data


def write_refusals(args: argparse.Namespace, report: Dict[str, Any]) -> None:
    """Each listed refusal, with its line's text when FILE can be read again."""
    if not args.refused or not report["refusals"]:
        return
    wanted = {refusal["line"]: refusal for refusal in report["refusals"]}
    texts: Dict[int, str] = {}
    if args.file != "-":
        with open(args.file, "rb") as source:
            for number, line in enumerate(source, 1):
                if number in wanted:
                    texts[number] = line.rstrip(b"\r\n").decode("utf-8", "replace")
    with open(args.refused, "w") as out:
        for number, refusal in wanted.items():
            out.write(json.dumps({**refusal, "text": texts.get(number)}) + "\n")


def import_summary(report: Dict[str, Any], counter: Counter) -> str:
    seconds = time.monotonic() - counter.started
    lines = [
        f"imported {report['written']:,} documents ({report['created']:,} created, {report['replaced']:,} replaced)"
        f" from {report['last_line']:,} lines in {seconds:.1f} s ({report['written'] / max(seconds, 1e-6):,.0f}/s)",
    ]
    if report["skipped"]:
        lines.append(
            f"skipped {report['skipped']:,} lines written before (resumed after line {report['resumed_after']})"
        )
    if report["refused"]:
        listed = report["refusals_listed"]
        lines.append(f"refused {report['refused']:,} lines" + (f" (the first {listed} listed)" if listed else ""))
        lines += [f"  line {r['line']}: {r['status']} {r['detail']}" for r in report["refusals"][:5]]
    return "\n".join(lines)


# -- export ---------------------------------------------------------------------


def run_export(args: argparse.Namespace) -> int:
    after = None
    if args.resume:
        if args.file == "-":
            raise TransferError("--resume needs a FILE, not stdout")
        after = last_exported_id(args.file)
    query = {"with_ids": "1"}
    if after is not None:
        query["cursor"] = base64.urlsafe_b64encode(after).rstrip(b"=").decode("ascii")
    connection, prefix = connect(args.url)
    path = f"{prefix}/v1/{args.collection}?{urlencode(query)}"
    try:
        connection.request("GET", path, headers=headers(args, Accept=NDJSON))
        reply = connection.getresponse()
        if reply.status != 200:
            raise TransferError(f"the server refused the export: {problem_text(reply.status, reply.read())}")
        # The server's count of the collection (all of it, not after the cursor): the bar's total, for an ETA.
        total = int(reply.getheader(COUNT_HEADER) or 0) or None
        mode = "ab" if args.resume else "wb"
        with opened(args.file, mode) as out, progress_bar(args, total, f"export {args.collection}", "docs") as bar:
            counter = Counter(bar, by_documents=True)
            copy(reply, out, counter)
    except (OSError, http.client.HTTPException) as error:
        raise TransferError(
            f"the export was cut short ({error!r}); --resume goes on after the last whole line"
        ) from None
    seconds = time.monotonic() - counter.started
    print(
        f"exported {counter.documents:,} documents ({counter.bytes:,} bytes) in {seconds:.1f} s"
        f" ({counter.rate():,.0f}/s)",
        file=sys.stderr,
    )
    return 0


def copy(reply: http.client.HTTPResponse, out: IO[bytes], counter: Counter) -> None:
    while True:
        data = reply.read1(BLOCK)
        if not data:
            counter.show()
            return
        out.write(data)
        counter.add(data)


def last_exported_id(path: str) -> Optional[bytes]:
    """The id of FILE's last whole line (None: no line), once FILE is cut after that line."""
    with open(path, "rb+") as exported:
        end = exported.seek(0, os.SEEK_END)
        tail, start = b"", end
        while start > 0 and tail.count(b"\n") < 2:
            start = max(0, start - BLOCK)
            exported.seek(start)
            tail = exported.read(end - start)
        whole = tail[: tail.rfind(b"\n") + 1]
        exported.truncate(start + len(whole))
    lines: List[bytes] = whole.splitlines()
    if not lines:
        return None
    line = lines[-1]
    if not line.startswith(b'{"id":"') or b'","doc":' not in line:
        raise TransferError(f"{path} does not end with a line of an export (with its id): cannot resume it")
    return line[7 : line.index(b'","doc":')]
