"""Issue 46's bulk figures: an NDJSON import and export of many ~200 B documents, beside the store's own pace.

One Redis, one Jetway (``--workers``, production defaults: authorization
and the access log on). In one run:

- the import: ``--documents`` lines (``?id=/id``) sent to
  ``POST /v1/_import/bulk`` by ``--streams`` clients at once (each its share
  of the lines, as fast as the server reads them); documents/s from the
  first byte to the last report, and each worker's RSS at 10% of the bytes
  sent and at the end;
- the export: ``GET /v1/bulk`` as NDJSON, read as fast as a client can;
  MB/s of body, and its bytes checked against what was imported;
- the ceiling: Redis running the import's hash writes and feed events for
  as many documents (at most ``RAW_DOCUMENTS``), pipelined with no script
  (``loadtest.studies._raw_writes``), on the same Redis.

Writes ``loadtest/results/bulk.md`` (appended, one section per run).

    .venv/bin/python -m loadtest.studies._bulk [--documents 1000000] [--streams 1] [--workers 2] [--size 200]
        [--label after]
    .venv/bin/python -m loadtest.studies._bulk --profile import --documents 100000   # vmprof of one worker's import
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple
from urllib.parse import urlsplit

from loadtest import _data, _token
from loadtest._gate import cpu_seconds
from loadtest._servers import Processes, stop_on_sigterm
from loadtest._token import ROOT
from loadtest.studies._batch_pace import redis_cli
from loadtest.studies._raw_writes import ceiling
from loadtest.studies._served import append_report, serve_one

REPORT = ROOT / "loadtest" / "results" / "bulk.md"
SIZE = 200
COLLECTION = "bulk"
SEND_BLOCK = 256 * 1024
# Documents the ceiling writes: enough for a second of Redis's time, few enough to hold their commands in memory.
RAW_DOCUMENTS = 300_000


def ndjson(first: int, count: int, size: int = SIZE) -> bytes:
    """``count`` documents of ~``size`` bytes, one per line, each naming its id at /id."""
    return b"".join(_data.document(f"d{number:09d}", size) + b"\n" for number in range(first, first + count))


def _connect(base: str) -> socket.socket:
    parts = urlsplit(base)
    return socket.create_connection((parts.hostname, parts.port), timeout=600)


def _response(sock: socket.socket) -> Tuple[bytes, bytes]:
    """A whole response with a Content-Length: its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def import_stream(
    base: str, auth: str, body: bytes, sent: List[int], result: Dict[str, object], collection: str = COLLECTION
) -> None:
    """One client's import: its lines sent in blocks as fast as the server takes them; the report kept."""
    sock = _connect(base)
    try:
        sock.sendall(
            b"POST /v1/_import/%s?id=/id HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n"
            % (collection.encode(), auth.encode(), len(body))
        )
        with memoryview(body) as view:
            for start in range(0, len(body), SEND_BLOCK):
                sock.sendall(view[start : start + SEND_BLOCK])
                sent[0] += min(SEND_BLOCK, len(body) - start)
        head, answer = _response(sock)
        result["status"], result["report"] = head.split(b" ")[1].decode(), json.loads(answer)
    finally:
        sock.close()


def redis_cpu_seconds(socket_path: str) -> float:
    """Redis's own CPU so far (``INFO cpu``: user and system, its main thread and the rest)."""
    found = dict(line.split(":", 1) for line in redis_cli(socket_path, "INFO", "cpu").split() if ":" in line)
    return float(found["used_cpu_sys"]) + float(found["used_cpu_user"])


def run_import(
    processes: Processes, base: str, auth: str, documents: int, streams: int, socket_path: str, size: int = SIZE
) -> Dict[str, object]:
    share = documents // streams
    bodies = [ndjson(number * share, share, size) for number in range(streams)]
    total = sum(len(body) for body in bodies)
    sent = [0]
    results: List[Dict[str, object]] = [{} for _ in bodies]
    threads = [
        threading.Thread(target=import_stream, args=(base, auth, body, sent, result), daemon=True)
        for body, result in zip(bodies, results)
    ]
    rss_at_tenth: List[float] = []
    master = processes.named["jetway"].pid
    workers_before, redis_before = cpu_seconds(master), redis_cpu_seconds(socket_path)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        if not rss_at_tenth and sent[0] >= total / 10:
            rss_at_tenth = processes.worker_rss_mb("jetway")
        time.sleep(0.05)
    took = time.perf_counter() - started
    workers_cpu, redis_cpu = cpu_seconds(master) - workers_before, redis_cpu_seconds(socket_path) - redis_before
    for result in results:
        report = result.get("report") or {}
        if result.get("status") != "200" or report.get("written") != share:  # type: ignore[union-attr]
            raise RuntimeError(f"the import failed: {result.get('status')} {str(report)[:300]}")
    return {
        "documents/s": streams * share / took,
        "MB/s": total / took / 1e6,
        "seconds": took,
        "rss_at_tenth": rss_at_tenth,
        "rss_at_end": processes.worker_rss_mb("jetway"),
        "bytes": total,
        "worker µs/document": workers_cpu / documents * 1e6,
        "redis µs/document": redis_cpu / documents * 1e6,
    }


def run_export(base: str, auth: str, socket_path: str = "", master: int = 0) -> Dict[str, float]:
    """The whole collection as NDJSON, read as fast as this client can; MB/s of chunked body, and Redis's
    and the workers' CPU seconds per MB (given its socket and the master's pid)."""
    sock = _connect(base)
    received = 0
    tail = b""
    buffer = bytearray(1 << 20)
    redis_before = redis_cpu_seconds(socket_path) if socket_path else 0.0
    workers_before = cpu_seconds(master) if master else 0.0
    started = time.perf_counter()
    try:
        sock.sendall(
            b"GET /v1/%s HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nAccept: application/x-ndjson\r\n\r\n"
            % (COLLECTION.encode(), auth.encode())
        )
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            got = sock.recv_into(buffer)
            if not got:
                raise RuntimeError(f"the export ended early after {received} bytes")
            received += got
            tail = (tail + bytes(buffer[:got]))[-16:]
    finally:
        sock.close()
    took = time.perf_counter() - started
    redis_cpu = redis_cpu_seconds(socket_path) - redis_before if socket_path else float("nan")
    workers_cpu = cpu_seconds(master) - workers_before if master else float("nan")
    return {
        "MB/s": received / took / 1e6,
        "seconds": took,
        "bytes": received,
        "redis s/MB": redis_cpu / received * 1e6,
        "workers s/MB": workers_cpu / received * 1e6,
    }


def profile(python: Path, documents: int, case: str) -> int:
    """One worker as ``loadtest.studies._request_path --serve`` runs it; vmprof over an import of ``documents``,
    or (``case`` export) over three exports of them."""
    with tempfile.TemporaryDirectory(prefix="jetway-bulk-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        token = _token.resolve(str(python), redis_url).token or ""
        worker, base, result = serve_one(processes, python, redis_url, token, Path(scratch))
        auth = f"Bearer {token}"
        for _ in range(3):  # the JIT's warm-up
            import_stream(base, auth, ndjson(0, 20_000), [0], {})
        if case == "export":
            import_stream(base, auth, ndjson(0, documents), [0], {})
            run_export(base, auth)
        worker.send_signal(signal.SIGUSR1)  # vmprof on
        if case == "export":
            for _ in range(3):
                run_export(base, auth)
        else:
            import_stream(base, auth, ndjson(0, documents), [0], {})
        processes.stop(worker)
        print(result.read_text())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--streams", type=int, default=1, help="imports at once, each its share of the documents")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=SIZE, help="bytes of each document")
    parser.add_argument("--exports", type=int, default=3, help="exports of the whole collection, one after another")
    parser.add_argument("--label", default="", help="a name for this run in the report (before, after)")
    parser.add_argument("--profile", choices=("import", "export"), help="vmprof over one worker's import or export")
    args = parser.parse_args()
    stop_on_sigterm()
    python = Path(sys.executable)
    if args.profile:
        return profile(python, args.documents, args.profile)
    with tempfile.TemporaryDirectory(prefix="jetway-bulk-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        socket_path = redis_url[len("unix://") :]
        settings = (("JETWAY_ACCESS_LOG", "on"),)
        base = processes.jetway("jetway", python, redis_url, args.workers, settings=settings)
        auth = _token.resolve(str(python), redis_url).headers()["Authorization"]
        imported = run_import(processes, base, auth, args.documents, args.streams, socket_path, args.size)
        master = processes.named["jetway"].pid
        exports = [run_export(base, auth, socket_path, master) for _ in range(args.exports)]
        raw = ceiling(socket_path, min(args.documents, RAW_DOCUMENTS), args.size, redis_cpu_seconds)
    export_rates = [run["MB/s"] for run in exports]
    export_rate = statistics.median(export_rates)
    redis_per_mb = statistics.median(run["redis s/MB"] for run in exports)
    workers_per_mb = statistics.median(run["workers s/MB"] for run in exports)
    exported_per_second = args.documents / statistics.median(run["seconds"] for run in exports)
    lines = [
        f"`python -m loadtest.studies._bulk --documents {args.documents} --streams {args.streams}"
        f" --workers {args.workers} --size {args.size}`",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| import: documents/s ({args.documents:,} of ~{args.size} B) | {imported['documents/s']:,.0f} |",
        f"| import: MB/s of NDJSON | {imported['MB/s']:.1f} |",
        f"| import: the workers' CPU per document, µs | {imported['worker µs/document']:.1f} |",
        f"| import: Redis's CPU per document, µs | {imported['redis µs/document']:.1f} |",
        f"| ceiling: HSET and XADD pipelined, no script (`_raw_writes`), documents/s | {raw['documents/s']:,.0f} |",
        f"| ceiling: Redis's CPU per document, µs | {raw['redis µs/document']:.1f} |",
        f"| import ÷ ceiling (#60: ≥ 0.5) | {imported['documents/s'] / raw['documents/s']:.3f} |",
        f"| workers' RSS at 10% of the bytes sent, MB | {imported['rss_at_tenth']} |",
        f"| workers' RSS at the end, MB | {imported['rss_at_end']} |",
        f"| export: MB/s (median of {args.exports}) | {export_rate:.1f} |",
        f"| export: each run, MB/s | {', '.join(f'{rate:.1f}' for rate in export_rates)} |",
        f"| export: documents/s (median) | {exported_per_second:,.0f} |",
        f"| export: Redis's CPU per MB sent, ms | {redis_per_mb * 1e3:.1f} |",
        f"| export: the workers' CPU per MB sent, ms | {workers_per_mb * 1e3:.1f} |",
    ]
    append_report(REPORT, "Bulk import and export", args.label or "run", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
