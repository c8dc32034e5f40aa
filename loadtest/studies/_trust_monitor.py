"""What ``loadtest.studies._trust`` watches while an attack runs: /healthz gaps, worker RSS, stray connections.

``Monitor`` runs in a process of its own (spawned, so the attack's client,
which may read hundreds of MB, never holds up a probe): one thread, a few
keep-alive connections to ``/healthz`` on 127.0.0.1, one request out on
each at a time, a new one ``PROBE_EVERY`` after the last answer; it keeps
the longest gap between two answers on any connection (a request still
unanswered when it stops counts up to then). Every ``SAMPLE_EVERY`` it reads
each worker's RSS from /proc (the master's children, so a worker that
replaces a dead one is seen too). Which worker holds a probe connection is
read from /proc (the socket's inode among the workers' fds), so the report
can say whether both workers were probed.

``Listener`` is a loopback port that records every connection made to it
and closes it at once: a schema that names it shows whether a worker
fetched anything.
"""

from __future__ import annotations

import bisect
import multiprocessing
import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from loadtest.studies._attacks import content_length

PROBE_EVERY = 0.02
SAMPLE_EVERY = 0.02
KEEP_GAPS_OVER = 0.05  # seconds; shorter gaps are never the longest that matters
SELF = 0  # the monitor's own entry in a schedstat sample
PROBE_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: trust\r\n\r\n"


def worker_pids(master: int) -> List[int]:
    try:
        return sorted(int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split())
    except OSError:
        return []


def rss_mb_or_none(pid: int) -> Optional[float]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def wait_ns(pid: int) -> Optional[int]:
    """How long the process's main thread has waited for a CPU while runnable (/proc/PID/schedstat), in ns."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def waited(timeline: List[Tuple[float, Dict[int, int]]], pid: int, start: float, end: float) -> float:
    """Seconds ``pid`` waited for a CPU from the last sample at or before ``start`` to the first at or after ``end``."""
    times = [when for when, _ in timeline]
    first, last = bisect.bisect_right(times, start) - 1, bisect.bisect_left(times, end)
    if first < 0 or last >= len(timeline):
        return 0.0
    before, after = timeline[first][1].get(pid), timeline[last][1].get(pid)
    if before is None or after is None:
        return 0.0
    return max(0, after - before) / 1e9


def _socket_inode(server_port: int, client_port: int) -> Optional[str]:
    """The inode of the server's end of the loopback connection from ``client_port``."""
    want_local, want_remote = f"{server_port:04X}", f"{client_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[1].endswith(":" + want_local) and fields[2].endswith(":" + want_remote):
                return fields[9]
    return None


def holder(pids: List[int], server_port: int, client_port: int) -> Optional[int]:
    """The worker whose fds hold the server's end of this connection."""
    inode = _socket_inode(server_port, client_port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pid
        except OSError:
            continue
    return None


class _Probe:
    """One keep-alive connection asking /healthz, one request out at a time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: Optional[socket.socket] = None
        self.buffer = b""
        self.sent_at: Optional[float] = None
        self.last_answer: Optional[float] = None  # gaps are counted from a probe's first answer on
        self.longest = 0.0
        self.answers = 0
        self.bad = 0
        self.reconnects = 0
        self.worker: Optional[int] = None
        self.gaps: List[Tuple[float, float, Optional[int]]] = []  # (last answer, this answer, worker)
        self.seen_workers: Set[int] = set()

    def connect(self) -> None:
        self.buffer, self.sent_at, self.worker, self.sock = b"", None, None, None
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            return  # the server is down: tried again next turn
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.sock = sock

    def drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.reconnects += 1
        self.connect()

    def due(self, now: float) -> bool:
        if self.sock is None:
            self.connect()
        if self.sock is None or self.sent_at is not None:
            return False
        return self.last_answer is None or now - self.last_answer >= PROBE_EVERY

    def send(self, now: float) -> None:
        try:
            self.sock.send(PROBE_REQUEST)  # type: ignore[union-attr]
            self.sent_at = now
        except (BlockingIOError, InterruptedError):
            pass  # not connected yet: next turn
        except OSError:
            self.drop()

    def readable(self, now: float) -> bool:
        """Read what arrived; True when a whole answer came in (the first, to find its worker)."""
        try:
            chunk = self.sock.recv(65536)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.drop()
            return False
        self.buffer += chunk
        head, found, body = self.buffer.partition(b"\r\n\r\n")
        if not found or len(body) < content_length(head):
            return False
        self.buffer = b""
        self.sent_at = None
        if self.last_answer is not None:
            self.longest = max(self.longest, now - self.last_answer)
            if now - self.last_answer > KEEP_GAPS_OVER:
                self.gaps.append((self.last_answer, now, self.worker))
        self.last_answer = now
        self.answers += 1
        if not head.startswith(b"HTTP/1.1 200"):
            self.bad += 1
        return self.worker is None and self.answers <= 5

    def finish(self, now: float) -> float:
        if self.sent_at is not None and self.last_answer is not None:
            self.longest = max(self.longest, now - self.last_answer)
            self.gaps.append((self.last_answer, now, self.worker))
        if self.sock is not None:
            self.sock.close()
        return self.longest


def watch(port: int, master: int, connections: int, stop: Any, results: Any) -> None:
    """The monitor's loop (in its own process) until ``stop`` is set; its findings into ``results``."""
    probes = [_Probe(port) for _ in range(connections)]
    for probe in probes:
        probe.connect()
        time.sleep(0.01)  # staggered, so the workers' accepts spread them
    rss: Dict[int, List[float]] = {}  # pid -> [first, peak, last]
    timeline: List[Tuple[float, Dict[int, int]]] = []
    next_sample = 0.0
    while not stop.is_set():
        now = time.monotonic()
        for probe in probes:
            if probe.due(now):
                probe.send(now)
        if now >= next_sample:
            next_sample = now + SAMPLE_EVERY
            timeline.append((now, _sample(master, rss)))
        poller = select.poll()
        by_fd = {probe.sock.fileno(): probe for probe in probes if probe.sock is not None}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(5):
            probe = by_fd[fd]
            if probe.sock is not None and probe.readable(time.monotonic()) and probe.sock is not None:
                probe.worker = holder(worker_pids(master), port, probe.sock.getsockname()[1])
                if probe.worker is not None:
                    probe.seen_workers.add(probe.worker)
    end = time.monotonic()
    longest = max(probe.finish(end) for probe in probes)
    timeline.append((time.monotonic(), _sample(master, rss)))
    gaps = [gap for probe in probes for gap in probe.gaps]
    results.put(
        {
            "longest_gap": longest,
            "net_gap": max((_net(timeline, gap) for gap in gaps), default=0.0),
            "gaps_over_100ms": sum(1 for start, stop, _ in gaps if stop - start > 0.1),
            "answers": sum(probe.answers for probe in probes),
            "bad_answers": sum(probe.bad for probe in probes),
            "reconnects": sum(probe.reconnects for probe in probes),
            "workers_probed": sorted({pid for probe in probes for pid in probe.seen_workers}),
            "rss": rss,
        }
    )


def _net(timeline: List[Tuple[float, Dict[int, int]]], gap: Tuple[float, float, Optional[int]]) -> float:
    """A gap less the time its worker (or, not known, the one that waited most) and the monitor waited for a CPU."""
    start, end, worker = gap
    pids = [worker] if worker is not None else list(timeline[-1][1]) if timeline else []
    worker_wait = max((waited(timeline, pid, start, end) for pid in pids if pid != SELF), default=0.0)
    return max(0.0, end - start - worker_wait - waited(timeline, SELF, start, end))


def _sample(master: int, rss: Dict[int, List[float]]) -> Dict[int, int]:
    """Each worker's RSS into ``rss``; the workers' and the monitor's CPU waits so far."""
    waits = {SELF: wait_ns(os.getpid()) or 0}
    for pid in worker_pids(master):
        waits[pid] = wait_ns(pid) or 0
        size = rss_mb_or_none(pid)
        if size is None:
            continue
        if pid not in rss:
            rss[pid] = [size, size, size]
        else:
            rss[pid][1] = max(rss[pid][1], size)
            rss[pid][2] = size
    return waits


class Monitor:
    """``watch`` in a spawned process, for the length of a ``with`` block."""

    def __init__(self, port: int, master: int, connections: int = 6) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.results = context.Queue()
        self.process = context.Process(target=watch, args=(port, master, connections, self.stop, self.results))
        self.found: Dict[str, Any] = {}

    def __enter__(self) -> Monitor:
        self.process.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        try:
            self.found = self.results.get(timeout=30)
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()


class Listener:
    """A loopback port that records when anything connects to it, and closes each connection at once."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.accepted: List[Tuple[float, Tuple[str, int]]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, peer = self.socket.accept()
            except OSError:
                continue
            self.accepted.append((time.monotonic(), peer))
            connection.close()

    def since(self, start: float) -> int:
        return sum(1 for when, _ in self.accepted if when >= start)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.socket.close()


def pids_alive(pids: Set[int]) -> Set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists() and _not_zombie(pid)}


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
