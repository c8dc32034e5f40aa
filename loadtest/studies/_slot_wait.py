"""How long a new connection waits for a dead worker's slot (issue #60, "No connection waits for a worker").

Starts a private Redis and a master with two workers (their warm-up on, as
in production), opens new connections from ``--clients`` threads (each
connects, asks ``GET /healthz``, reads the answer, closes), SIGKILLs one
worker after ``--before`` seconds, and goes on for ``--after`` seconds.
Reports, for the connections opened before the kill, in its first 100 ms
(the master has not noticed yet: those queued on the dead slot's socket
wait for the respawn whatever it does), and after, how many, the slowest
(connect to answer) and how many took over 100 ms. ``--tree DIR`` runs the
master of another checkout (the code before a change).

    .venv/bin/python -m loadtest.studies._slot_wait [--clients 8] [--before 2] [--after 12] [--rounds 1] [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Tuple

from loadtest._servers import PYPY, Processes

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
SLOW = 0.1


def ask(port: int) -> float:
    """One new connection's time from connect to its whole answer, in seconds."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(REQUEST)
        data = b""
        while not data.endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return time.monotonic() - started


def client(port: int, stop: threading.Event, out: List[Tuple[float, float]], errors: List[str]) -> None:
    while not stop.is_set():
        at = time.monotonic()
        try:
            out.append((at, ask(port)))
        except OSError as error:
            errors.append(f"{type(error).__name__}: {error}")


def one_round(clients: int, before: float, after: float, tree: Path) -> str:
    with tempfile.TemporaryDirectory() as directory, Processes(Path(directory)) as processes:
        redis_url = processes.redis()
        base = processes.jetway("jetway", PYPY, redis_url, 2, settings=[("JETWAY_AUTH", "off")], cwd=tree)
        port = int(base.rsplit(":", 1)[1])
        master = processes.named["jetway"].pid
        stop, out, errors = threading.Event(), [], []  # type: ignore[var-annotated]
        threads = [threading.Thread(target=client, args=(port, stop, out, errors)) for _ in range(clients)]
        for thread in threads:
            thread.start()
        time.sleep(before)
        victim = int(Path(f"/proc/{master}/task/{master}/children").read_text().split()[0])
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        time.sleep(after)
        stop.set()
        for thread in threads:
            thread.join()
    lines = []
    windows = (("before the kill", -before, 0.0), ("its first 100 ms", 0.0, SLOW), ("after", SLOW, after))
    for name, start, end in windows:
        chosen = [wait for at, wait in out if start <= at - killed < end]
        slow = sum(1 for wait in chosen if wait > SLOW)
        slowest = max(chosen, default=0.0)
        lines.append(f"{name}: {len(chosen)} connections, slowest {slowest:.3f} s, {slow} over 100 ms")
    return "; ".join(lines) + f"; {len(errors)} failed {sorted(set(errors))[:3]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--before", type=float, default=2.0)
    parser.add_argument("--after", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tree", type=Path, default=Path("."), help="the checkout whose master runs")
    args = parser.parse_args()
    for number in range(args.rounds):
        report = one_round(args.clients, args.before, args.after, args.tree.resolve())
        print(f"round {number + 1}: {report}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
