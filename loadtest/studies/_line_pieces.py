"""What a long NDJSON line costs a worker when it arrives in small pieces (issue #55, the line reader).

One worker (auth off), a private Redis; an import of one 1 MB line sent in
one piece, then in 50-byte pieces (each its own send, TCP_NODELAY, 0.1 ms
apart so that the worker reads each on its own, as it would from a far
client), in
turns; the worker's CPU (utime + stime from /proc) for each import. With
``--tree DIR`` the server runs DIR's code (an older checkout), so before
and after are measured side by side:

    .venv/bin/python -m loadtest.studies._line_pieces --rounds 3 [--tree /tmp/old]

Writes loadtest/results/line_pieces.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

from loadtest._servers import ROOT, Processes

LINE = b'{"pad":"' + b"x" * 1_000_000 + b'"}\n'
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAUSE = 0.0001


def worker_cpu(master_pid: int) -> float:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    fields = Path(f"/proc/{children[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def send(port: int, piece: int) -> int:
    """One import of LINE in pieces of ``piece`` bytes; the answer's status."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(
            b"POST /v1/_import/pieces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
            b"Content-Length: %d\r\n\r\n" % len(LINE)
        )
        for start in range(0, len(LINE), piece):
            sock.sendall(LINE[start : start + piece])
            if piece < len(LINE):
                time.sleep(PAUSE)  # each piece its own segment, read on its own: what an attacker sends
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        return int(answer.split(b" ", 2)[1])


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose server runs")
    args = parser.parse_args(argv)
    rows: List[Tuple[int, float, float]] = []
    with tempfile.TemporaryDirectory() as directory, Processes(Path(directory)) as processes:
        redis_url = processes.redis()
        settings = (("JETWAY_AUTH", "off"), ("JETWAY_MAX_BODY", str(2 * len(LINE))), ("JETWAY_WARM_UP", "0"))
        base = processes.jetway("jetway", ROOT / ".venv/bin/python", redis_url, 1, settings=settings, cwd=args.tree)
        port = int(base.rsplit(":", 1)[1])
        master = processes.named["jetway"].pid
        for number in range(args.rounds + 1):  # the first round warms the JIT, and is not counted
            costs = []
            for piece in (len(LINE), 50):
                before = worker_cpu(master)
                status = send(port, piece)
                time.sleep(0.2)  # the worker's last work for it
                costs.append(worker_cpu(master) - before)
                assert status == 200, status
            if number:
                rows.append((number, costs[0], costs[1]))
    lines = [
        "# A 1 MB NDJSON line in one piece and in 50-byte pieces: the worker's CPU",
        "",
        f"`.venv/bin/python -m loadtest.studies._line_pieces --rounds {args.rounds}"
        + (f" --tree {args.tree}`" if args.tree != ROOT else "`"),
        "",
        "| round | one piece (s) | 50-byte pieces (s) | ratio |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {n} | {one:.2f} | {small:.2f} | {small / max(one, 0.01):.1f}x |" for n, one, small in rows]
    report = "\n".join(lines) + "\n"
    out = ROOT / "loadtest/results/line_pieces.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
