"""The change feed's measured promises: delivery latency to many subscribers, and memory with some that never read.

``python -m loadtest.studies._feed`` (after ``make setup``) starts a private Redis
and a master with ``--workers`` workers (production defaults: authorization
on with an unrated token, access log on), then:

1. opens ``--subscribers`` SSE streams on one collection: ``--probes`` of
   them in this process, which note when each event arrives, the rest in a
   second process (``_readers``) that reads and discards, so that its work
   does not delay the probes' clocks;
2. after ``--warmup`` seconds of the same writes, untimed (PyPy's JIT),
   phase "all read": PUTs at ``--rate`` writes/s for ``--seconds`` through
   keep-alive connections; an event's latency is the time from its write's
   2xx to its arrival at a probe (0 when it arrived first);
3. phase "N stalled": opens ``--stalled`` more streams that never read (a
   4 KiB receive buffer), and writes as in phase 2 for ``--stalled-seconds``
   (the kernel takes up to ``tcp_wmem``'s 4 MiB of each before the worker
   holds any, so this phase lasts long enough to fill both): the other subscribers'
   latency again, and each worker's resident memory sampled twice a second
   against what the stalled streams may hold (``JETWAY_FEED_BUFFER`` each).

``--tickets``: every subscriber authorizes with its own ticket (``?ticket=``,
as a browser's EventSource must), made beforehand by ``POST
/v1/_changes/{coll}/tickets``. It writes ``loadtest/results/feed.md``. The client runs on the same two
cores as the server: compare runs made side by side, not with another day's.

A write's own cost with the feed on is ``make bench``'s: ``BENCH_SERVERS=pypy,nofeed
BENCH_ENDPOINTS=put``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from loadtest._servers import PYPY, Processes, wait_until
from loadtest._token import create as make_token
from loadtest.studies._hot_cache import OUTPUT, _metric, _percentiles

COLLECTION = "feedbench"
DOCUMENTS = 1000
LATENCY_TARGET_MS = 50.0
WRITERS = 16  # keep-alive connections the writes go through
DRAIN_SECONDS = 3.0  # after the last write, for the last events to arrive
STALLED_RECEIVE_BUFFER = 4096
_ETAG = re.compile(rb'"etag":"((?:[^"\\]|\\.)*)"')
_EVENT = re.compile(rb"^event: ([a-z-]+)", re.MULTILINE)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.studies._feed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=2000, help="streams that read (probes included)")
    parser.add_argument("--probes", type=int, default=50, help="of them, those whose events are timed")
    parser.add_argument("--rate", type=float, default=1000.0, help="writes per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="of writes, per phase")
    parser.add_argument("--stalled", type=int, default=100, help="streams that never read, in the second phase")
    # The kernel takes up to tcp_wmem's 4 MiB per connection before a worker holds anything:
    # at ~150 KB/s per stream that is ~30 s, then the buffer fills and the stream is ended.
    parser.add_argument("--stalled-seconds", type=float, default=60.0, help="of writes, in the second phase")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of writes first, not timed (the JIT)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--readers-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--token", default="", help=argparse.SUPPRESS)
    parser.add_argument("--state", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tickets-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tickets", action="store_true", help="each subscriber by its own ticket, as a browser")
    args = parser.parse_args(argv)
    if args.readers_only:
        asyncio.run(_readers(args))
        return 0
    report = asyncio.run(measure(args))
    OUTPUT.mkdir(parents=True, exist_ok=True)
    output = OUTPUT / "feed.md"
    output.write_text(report)
    print(report)
    print(f"written to {output}")
    return 0


# --- subscribers ----------------------------------------------------------------


def _stream_request(port: int, token: str, ticket: str = "") -> bytes:
    """HTTP/1.0, so the stream ends by closing and needs no de-chunking; by ``ticket`` as a browser's
    EventSource would be (no ``Authorization`` header), else by the bearer token."""
    credential = f"?ticket={ticket}" if ticket else ""
    authorization = "" if ticket else f"Authorization: Bearer {token}\r\n"
    return (
        f"GET /v1/_changes/{COLLECTION}{credential} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
        f"{authorization}Accept: text/event-stream\r\n\r\n"
    ).encode()


def _tickets(port: int, token: str, count: int) -> List[str]:
    """``count`` feed tickets (``POST /v1/_changes/{coll}/tickets``), one per subscriber, as browsers get them."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    made = []
    for _ in range(count):
        connection.request("POST", f"/v1/_changes/{COLLECTION}/tickets", headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 201:
            raise RuntimeError(f"a ticket was answered {response.status}: {body[:200]!r}")
        made.append(json.loads(body)["ticket"])
    connection.close()
    return made


@dataclass
class Subscriber(asyncio.Protocol):
    """One SSE stream: ready once its ``ready`` event came; a probe also notes each event's arrival."""

    request: bytes
    timed: bool
    ready: asyncio.Future
    arrivals: Dict[bytes, float] = field(default_factory=dict)
    named: Dict[str, int] = field(default_factory=dict)
    received: int = 0
    closed: bool = False
    _pending: bytes = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        self.received += len(data)
        if self.timed:
            data, self._pending = self._complete_frames(self._pending + data)
            for etag in _ETAG.findall(data):
                self.arrivals.setdefault(etag, now)
        if b"event: " in data:
            for name in _EVENT.findall(data):
                self.named[name.decode()] = self.named.get(name.decode(), 0) + 1
            if not self.ready.done() and b"event: ready" in data:
                self.ready.set_result(True)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"stream closed before ready: {exc}"))

    @staticmethod
    def _complete_frames(data: bytes) -> Tuple[bytes, bytes]:
        end = data.rfind(b"\n\n")
        return (data[: end + 2], data[end + 2 :]) if end >= 0 else (b"", data)


async def _subscribe(port: int, token: str, count: int, timed: bool, tickets: Sequence[str] = ()) -> List[Subscriber]:
    """``count`` streams, opened 100 at a time, each past its ``ready`` (the n-th by ``tickets[n]`` if given)."""
    loop = asyncio.get_running_loop()
    requests = [_stream_request(port, token, tickets[n] if tickets else "") for n in range(count)]
    subscribers: List[Subscriber] = []
    for start in range(0, count, 100):
        batch = [Subscriber(request, timed, loop.create_future()) for request in requests[start : start + 100]]
        for subscriber in batch:
            await loop.create_connection(lambda s=subscriber: s, "127.0.0.1", port)
        await asyncio.wait_for(asyncio.gather(*(s.ready for s in batch)), 60)
        subscribers += batch
    return subscribers


def _stalled(port: int, token: str, count: int) -> List[socket.socket]:
    """Streams whose client never reads (a small receive buffer, so the server's queue is what fills)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALLED_RECEIVE_BUFFER)
        sock.connect(("127.0.0.1", port))
        sock.sendall(_stream_request(port, token))
        sockets.append(sock)
    return sockets


async def _readers(args: argparse.Namespace) -> None:
    """The untimed subscribers, in a process of their own; their totals go to ``--state`` at SIGTERM."""
    state = Path(args.state)
    tickets = Path(args.tickets_file).read_text().split() if args.tickets_file else []
    subscribers = await _subscribe(args.port, args.token, args.subscribers, False, tickets)
    state.with_suffix(".ready").write_text(str(len(subscribers)))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    named: Dict[str, int] = {}
    for subscriber in subscribers:
        for name, count in subscriber.named.items():
            named[name] = named.get(name, 0) + count
    totals = {"bytes": sum(s.received for s in subscribers), "closed": sum(s.closed for s in subscribers)}
    state.write_text(json.dumps({**totals, "named": named}))


# --- writes ---------------------------------------------------------------------


@dataclass
class Phase:
    """One phase's writes: each ETag (as the event's JSON spells it) and when its 2xx came."""

    name: str
    acknowledged: Dict[bytes, float] = field(default_factory=dict)
    failed: int = 0
    started: float = 0.0
    ended: float = 0.0
    rss_mb: List[List[float]] = field(default_factory=list)


async def _write(port: int, token: str, phase: Phase, rate: float, seconds: float, first: int) -> None:
    """``rate`` PUTs a second for ``seconds`` (each sent at its due time, or as soon as a connection is free)."""
    total = int(rate * seconds)
    next_write = iter(range(total))
    phase.started = start = time.monotonic()

    async def writer() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for n in next_write:
                due = start + n / rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = b'{"n":%d,"pad":"%s"}' % (first + n, b"x" * 160)
                head = (
                    f"PUT /v1/{COLLECTION}/d{(first + n) % DOCUMENTS} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                status, etag = await _response(reader)
                if status in (200, 201) and etag:
                    # The event's JSON escapes the ETag's quotes.
                    phase.acknowledged[json.dumps(etag)[1:-1].encode()] = time.monotonic()
                else:
                    phase.failed += 1
        finally:
            writer.close()

    await asyncio.gather(*(writer() for _ in range(WRITERS)))
    phase.ended = time.monotonic()


async def _response(reader: asyncio.StreamReader) -> Tuple[int, str]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
    lowered = {name.lower(): value for name, value in headers.items()}
    await reader.readexactly(int(lowered.get("content-length", "0")))
    return int(head[0].split()[1]), lowered.get("etag", "")


# --- the run ---------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> str:
    probes_wanted = min(args.probes, args.subscribers)
    with tempfile.TemporaryDirectory(prefix="feed-") as directory, Processes(Path(directory)) as processes:
        redis_url = processes.redis()
        token = make_token(str(PYPY), redis_url, "feed")
        base = processes.jetway("jetway", PYPY, redis_url, args.workers, settings=[("JETWAY_ACCESS_LOG", "on")])
        port = int(base.rsplit(":", 1)[1])
        rss = {"started": processes.worker_rss_mb("jetway")}
        state = Path(directory) / "readers.json"
        readers = args.subscribers - probes_wanted
        command = [sys.executable, "-m", "loadtest.studies._feed", "--readers-only", "--port", str(port)]
        command += ["--token", token, "--subscribers", str(readers), "--state", str(state)]
        tickets = _tickets(port, token, args.subscribers) if args.tickets else []
        if tickets:
            (Path(directory) / "tickets").write_text("\n".join(tickets[probes_wanted:]))
            command += ["--tickets-file", str(Path(directory) / "tickets")]
        reading = processes.start("readers", command)
        ready = state.with_suffix(".ready")

        def readers_ready() -> bool:
            processes.check_alive(reading, "readers")
            return ready.exists()

        probes = await _subscribe(port, token, probes_wanted, True, tickets[:probes_wanted])
        wait_until(readers_ready, 300, f"{readers} subscribers")
        rss["subscribed"] = processes.worker_rss_mb("jetway")
        subscribers = _metric(base, "jetway_feed_subscribers")

        warmup = Phase("warm-up")
        await _run_phase(port, token, warmup, args, probes, processes, 0, args.warmup)
        first = len(warmup.acknowledged) + warmup.failed
        phases = [Phase("all read"), Phase(f"{args.stalled} stalled")]
        await _run_phase(port, token, phases[0], args, probes, processes, first, args.seconds)
        first += int(args.rate * args.seconds)
        stalled = _stalled(port, token, args.stalled)
        try:
            await _run_phase(port, token, phases[1], args, probes, processes, first, args.stalled_seconds)
            fell_behind = _metric(base, "jetway_feed_fell_behind_total")
        finally:
            for sock in stalled:
                sock.close()
        processes.stop(reading)
        totals = json.loads(state.read_text()) if state.exists() else {}
    return _report(args, phases, probes, rss, subscribers, fell_behind, totals)


async def _run_phase(
    port: int,
    token: str,
    phase: Phase,
    args: argparse.Namespace,
    probes: List[Subscriber],
    processes: Processes,
    first: int,
    seconds: float,
) -> None:
    async def sample_memory() -> None:
        while True:
            phase.rss_mb.append(processes.worker_rss_mb("jetway"))
            await asyncio.sleep(0.5)

    sampling = asyncio.ensure_future(sample_memory())
    try:
        await _write(port, token, phase, args.rate, seconds, first)
        await asyncio.sleep(DRAIN_SECONDS)
    finally:
        sampling.cancel()


def _latencies(phase: Phase, probes: List[Subscriber]) -> Tuple[List[float], int, int]:
    """Each (probe, write) pair's delivery latency in seconds, how many never arrived, how many came before the 2xx."""
    latencies, missing, early = [], 0, 0
    for probe in probes:
        for etag, acknowledged in phase.acknowledged.items():
            arrived = probe.arrivals.get(etag)
            if arrived is None:
                missing += 1
            else:
                early += arrived < acknowledged
                latencies.append(max(0.0, arrived - acknowledged))
    return latencies, missing, early


def _report(
    args: argparse.Namespace,
    phases: List[Phase],
    probes: List[Subscriber],
    rss: Dict[str, List[float]],
    subscribers: float,
    fell_behind: float,
    totals: dict,
) -> str:
    buffer_mb = int(os.environ.get("JETWAY_FEED_BUFFER", 1024 * 1024)) / 2**20
    lines = [
        "# Change feed: delivery latency and memory",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f},"
        f" {args.workers} workers (production defaults), {subscribers:,.0f} open streams"
        f" ({'each by its own ticket' if args.tickets else 'by the bearer token'})"
        f" ({len(probes)} timed), PUTs of ~190 B to {DOCUMENTS} documents at {args.rate:g}/s through"
        f" {WRITERS} connections, {args.warmup:g} s untimed, {args.seconds:g} s, then {args.stalled_seconds:g} s with"
        " the stalled streams;"
        f" `python -m loadtest.studies._feed --subscribers {args.subscribers} --probes {args.probes}"
        f" --rate {args.rate:g} --seconds {args.seconds:g} --stalled {args.stalled}"
        f" --stalled-seconds {args.stalled_seconds:g} --warmup {args.warmup:g} --workers {args.workers}"
        f"{' --tickets' if args.tickets else ''}`.",
        "",
        "| phase | writes/s done | failed | deliveries timed | p50 | p99 | max | never arrived | p99 target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for phase in phases:
        latencies, missing, _ = _latencies(phase, probes)
        done = len(phase.acknowledged) / max(phase.ended - phase.started, 1e-9)
        p50, p99, most = _percentiles(latencies) if latencies else (0.0, 0.0, 0.0)
        verdict = "met" if latencies and p99 <= LATENCY_TARGET_MS else "MISSED"
        lines.append(
            f"| {phase.name} | {done:,.0f} | {phase.failed} | {len(latencies):,} | {p50:.1f} ms | {p99:.1f} ms"
            f" | {most:.1f} ms | {missing:,} | ≤ {LATENCY_TARGET_MS:g} ms: {verdict} |"
        )
    steady = [max(sample) for sample in zip(*phases[0].rss_mb[-4:])] if phases[0].rss_mb else []
    peak = [max(sample) for sample in zip(*phases[1].rss_mb)] if phases[1].rss_mb else []
    # However the stalled streams fell to the workers, together they may hold one buffer each.
    allowed = args.stalled * buffer_mb
    growth = [after - before for before, after in zip(steady, peak)]
    memory_verdict = "met" if growth and sum(growth) <= allowed else "MISSED"
    lines += [
        "",
        "| each worker's RSS | MB |",
        "|---|---|",
        f"| started | {_mbs(rss['started'])} |",
        f"| with the streams open, before any write | {_mbs(rss['subscribed'])} |",
        f"| end of phase 1 (max of the last 2 s) | {_mbs(steady)} |",
        f"| phase 1's own swing (max - min of its samples) | {_mbs(_swing(phases[0].rss_mb))} |",
        f"| peak in phase 2 ({args.stalled} stalled) | {_mbs(peak)} |",
        f"| growth, phase 1 → peak of phase 2 | {_mbs(growth)} (together {sum(growth):.0f}; allowed:"
        f" {args.stalled} stalled x {buffer_mb:g} MiB = {allowed:.0f} MB: {memory_verdict}) |",
        "",
        f"Streams ended for not reading (`jetway_feed_fell_behind`): {fell_behind:,.0f} of {args.stalled} stalled."
        f" Untimed readers: {totals.get('bytes', 0) / 2**20:,.1f} MiB read, {totals.get('closed', 0)} closed by the"
        f" server, named events {totals.get('named', {})}. Probes' named events: {_named(probes)}.",
        "",
    ]
    return "\n".join(lines)


def _swing(samples: List[List[float]]) -> List[float]:
    return [max(worker) - min(worker) for worker in zip(*samples)]


def _mbs(values: List[float]) -> str:
    return ", ".join(f"{value:.0f}" for value in values)


def _named(probes: List[Subscriber]) -> Dict[str, int]:
    named: Dict[str, int] = {}
    for probe in probes:
        for name, count in probe.named.items():
            named[name] = named.get(name, 0) + count
    return named


if __name__ == "__main__":
    sys.exit(main())
