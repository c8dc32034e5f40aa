"""What a batch of 1,000 mixed operations costs a worker in resident memory.

One Jetway worker (production defaults: authorization on, access log on)
and a private Redis. The worker is warmed up with small batches, then sent
``--batches`` batches of 1,000 operations (puts of 1 KB documents, gets,
merge patches, creates, deletes, in turn) one after another; its RSS is read
from /proc before and after each. The report compares the largest rise with
the batch's own size (its request body and its answer), and writes it to
``loadtest/results/batch_memory.md``.

    .venv-loadtest/bin/python -m loadtest.studies._batch_memory [--batches 20]
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple
from urllib.parse import urlsplit

from loadtest import _data, _token
from loadtest._run import machine
from loadtest._servers import PYPY, Processes, stop_on_sigterm
from loadtest._token import ROOT

REPORT = ROOT / "loadtest" / "results" / "batch_memory.md"
OPERATIONS = 1000
KINDS = ("put", "get", "patch", "create", "delete")


def mixed_batch(round_number: int, size: int) -> bytes:
    """1,000 operations, the five kinds in turn, over ids that exist when each runs."""
    operations: List[Dict[str, Any]] = []
    for n in range(OPERATIONS):
        kind, doc_id = KINDS[n % len(KINDS)], f"d{n // len(KINDS)}"
        operation: Dict[str, Any] = {"op": kind, "collection": "memory"}
        if kind != "create":
            operation["id"] = doc_id
        if kind in ("put", "create"):
            operation["document"] = json.loads(_data.document(doc_id, size, round_number))
        elif kind == "patch":
            operation["patch"] = {"round": round_number}
        operations.append(operation)
    return json.dumps({"operations": operations}).encode()


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def send(base: str, headers: Dict[str, str], body: bytes) -> Tuple[int, bytes]:
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request("POST", "/v1/_batch", body, {**headers, "Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--size", type=int, default=1024, help="bytes of each document put or created")
    args = parser.parse_args()
    stop_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="jetway-batch-memory-") as scratch, Processes(Path(scratch)) as processes:
        redis_url = processes.redis()
        base = processes.jetway("jetway", PYPY, redis_url, 1, settings=(("JETWAY_ACCESS_LOG", "on"),))
        headers = _token.resolve(str(PYPY), redis_url).headers()
        master = processes.named["jetway"].pid
        worker = int(Path(f"/proc/{master}/task/{master}/children").read_text().split()[0])
        for warm in range(50):  # the JIT compiles the batch path before anything is measured
            status, _ = send(base, headers, _small_batch(warm))
            assert status == 200, status
        time.sleep(1)
        before = rss_mb(worker)
        rows, answer_bytes = [], 0
        body_bytes = len(mixed_batch(0, args.size))
        for number in range(1, args.batches + 1):
            status, answer = send(base, headers, mixed_batch(number, args.size))
            if status != 200:
                raise RuntimeError(f"batch {number}: {status} {answer[:300]!r}")
            statuses = {result["status"] for result in json.loads(answer)["results"]}
            if not statuses <= {200, 201, 204}:
                raise RuntimeError(f"batch {number}: statuses {sorted(statuses)}")
            answer_bytes = max(answer_bytes, len(answer))
            rows.append((number, rss_mb(worker)))
    peak = max(rss for _, rss in rows)
    own = (body_bytes + answer_bytes) / 2**20
    lines = [
        "# A worker's resident memory over batches of 1,000 mixed operations",
        "",
        f"`python -m loadtest.studies._batch_memory --batches {args.batches} --size {args.size}`,"
        f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {json.dumps(machine(PYPY))}",
        "",
        f"One worker, production defaults. A batch: {OPERATIONS} operations (put, get, patch, create, delete in"
        f" turn; {args.size} B documents), its body {body_bytes / 2**20:.2f} MiB, its answer"
        f" {answer_bytes / 2**20:.2f} MiB.",
        "",
        "| | MB |",
        "|---|---:|",
        f"| RSS after warm-up (50 batches of 10) | {before:.1f} |",
        f"| largest RSS over the {args.batches} batches | {peak:.1f} |",
        f"| rise | {peak - before:.1f} |",
        f"| the batch's own size (body + answer) | {own:.2f} |",
        f"| rise / own size | {(peak - before) / own:.1f}x |",
        "",
        "| batch | RSS MB |",
        "|---:|---:|",
        *(f"| {number} | {rss:.1f} |" for number, rss in rows),
    ]
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]))
    print(f"wrote {REPORT}")
    return 0


def _small_batch(number: int) -> bytes:
    operations = [{"op": "put", "collection": "warm", "id": f"w{n}", "document": {"n": number}} for n in range(10)]
    return json.dumps({"operations": operations}).encode()


if __name__ == "__main__":
    raise SystemExit(main())
