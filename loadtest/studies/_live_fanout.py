"""Many distinct live queries on one worker: does the worker stay responsive while it judges the writes?

``python -m loadtest.studies._live_fanout`` (after ``make setup``) starts a private
Redis and a master with one worker (authorization on), declares an index
on ``k``, opens ``--streams`` SSE live queries, each with a filter of its
own (``?k=eq.v<n>``), then makes ``--writes`` PUTs over ``--writers``
keep-alive connections (``--batch`` of them a request: a batch's events
reach the worker together; each write matches exactly one stream), while a
probe sends ``GET /healthz`` to the same worker every 20 ms. It prints the
probe's latency (max, p99, median), how many events the streams got (one
per write), how long the writes took and the worker's CPU seconds while
they did (on a machine shared with other work, the probe's maximum is
mostly the machine's: compare ``--streams 1``). Issue #55 item 6: at 3cefd6b,
2,000 streams and 4,000 writes held ``/healthz`` up to 1,316 ms. ``--tree``
runs another checkout's server code (``git archive <commit> | tar -x``), to
compare side by side.

``--in-process``: no server; the time of one reactor turn's delivery of a
chunk of ``--chunk`` events to a lane of ``--streams`` live subscribers with
distinct filters (``handlers.feed.hub``), five times: what the probe's
maximum cannot isolate on a shared machine. Run it with ``PYTHONPATH`` set to
a checkout to time that checkout's code.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence

from loadtest._servers import PYPY, ROOT, Processes
from loadtest._token import create as make_token

COLLECTION = "livefan"
PROBE_SECONDS = 0.02


class Stream(asyncio.Protocol):
    """One live query's SSE stream: ready once its ``ready`` event came; counts the events of its own."""

    def __init__(self, request: bytes, ready: asyncio.Future) -> None:
        self.request = request
        self.ready = ready
        self.events = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.events += data.count(b'"matches":')
        if not self.ready.done() and b"event: ready" in data:
            self.ready.set_result(True)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"stream closed before ready: {exc}"))


async def open_streams(port: int, token: str, count: int) -> List[Stream]:
    loop = asyncio.get_running_loop()
    streams: List[Stream] = []
    for start in range(0, count, 100):
        batch = []
        for n in range(start, min(start + 100, count)):
            request = (
                f"GET /v1/_changes/{COLLECTION}?k=eq.v{n} HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
            ).encode()
            stream = Stream(request, loop.create_future())
            await loop.create_connection(lambda s=stream: s, "127.0.0.1", port)
            batch.append(stream)
        await asyncio.wait_for(asyncio.gather(*(s.ready for s in batch)), 120)
        streams += batch
    return streams


def call(connection: http.client.HTTPConnection, method: str, path: str, token: str, body: bytes = b"") -> int:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection.request(method, path, body=body or None, headers=headers)
    response = connection.getresponse()
    response.read()
    return response.status


def write(port: int, token: str, numbers: Sequence[int], args: argparse.Namespace, failed: List[int]) -> None:
    """PUTs, or batches of ``args.batch`` puts (``POST /v1/_batch``): a batch's events reach a worker together."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for start in range(0, len(numbers), args.batch):
        group = numbers[start : start + args.batch]
        documents = [(f"w{n}", {"k": f"v{n % args.streams}", "n": n}) for n in group]
        if args.batch == 1:
            path, body = f"/v1/{COLLECTION}/{documents[0][0]}", json.dumps(documents[0][1]).encode()
            method = "PUT"
        else:
            operations = [{"op": "put", "collection": COLLECTION, "id": i, "document": d} for i, d in documents]
            path, body, method = "/v1/_batch", json.dumps({"operations": operations}).encode(), "POST"
        if call(connection, method, path, token, body) not in (200, 201):
            failed.extend(group)
    connection.close()


def probe(port: int, stop: threading.Event, latencies: List[float]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        latencies.append((time.perf_counter() - started) * 1000)
        time.sleep(PROBE_SECONDS)
    connection.close()


def worker_cpu_seconds(master: int) -> float:
    """User and system CPU of the master's worker so far (``/proc``; one worker here)."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    fields = Path(f"/proc/{children[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="livefan-") as directory, Processes(Path(directory)) as processes:
        redis_url = processes.redis()
        token = make_token(str(PYPY), redis_url, "livefan")
        base = processes.jetway("jetway", PYPY, redis_url, 1, cwd=Path(args.tree).resolve())
        port = int(base.rsplit(":", 1)[1])
        indexes = Path(directory) / "indexes.json"
        indexes.write_text(json.dumps({"by_k": {"fields": [{"name": "k", "pointer": "/k", "type": "string"}]}}))
        # Through the CLI, as an operator would (the load test's token has no admin scope).
        command = [str(PYPY), "-m", "api", "collections", "set", COLLECTION, "--indexes", str(indexes)]
        env = {**os.environ, "REDIS_URL": redis_url}
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
        time.sleep(0.5)  # the worker's settings cache hears of the index
        streams = await open_streams(port, token, args.streams)
        stop, latencies, failed = threading.Event(), [], []
        prober = threading.Thread(target=probe, args=(port, stop, latencies))
        prober.start()
        time.sleep(1.0)
        idle = len(latencies)
        master = processes.named["jetway"].pid
        cpu = worker_cpu_seconds(master)
        started = time.monotonic()
        shares = [range(w, args.writes, args.writers) for w in range(args.writers)]
        writers = [threading.Thread(target=write, args=(port, token, mine, args, failed)) for mine in shares]
        for writer in writers:
            writer.start()
        while any(writer.is_alive() for writer in writers):
            await asyncio.sleep(0.05)
        wrote = time.monotonic() - started
        deadline = time.monotonic() + 30
        while sum(s.events for s in streams) < args.writes - len(failed) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        delivered = time.monotonic() - started
        cpu = worker_cpu_seconds(master) - cpu
        stop.set()
        prober.join()
    during = sorted(latencies[idle:])
    got = sum(s.events for s in streams)

    def at(share: float) -> float:
        return during[min(len(during) - 1, int(share * len(during)))] if during else 0.0

    return (
        f"{args.streams} distinct live streams, {args.writes} writes ({len(failed)} failed) in {wrote:.1f} s,"
        f" all {got} events delivered in {delivered:.1f} s; the worker's CPU meanwhile {cpu:.1f} s\n"
        f"/healthz during: {len(during)} probes, max {max(during, default=0):.0f} ms, p99 {at(0.99):.0f} ms,"
        f" median {at(0.5):.1f} ms"
    )


def in_process(streams: int, size: int) -> str:
    """Five chunks of ``size`` events delivered to ``streams`` live subscribers, each its own filter: ms each."""
    from cache.feed.live_queries import LiveQuery
    from cache.feed.streams import Event
    from handlers.feed.hub import Chunk, Lane

    class Member:
        def __init__(self, live: LiveQuery) -> None:
            self.live, self.got = live, 0

        def deliver(self, chunk: Chunk) -> None:
            self.got += chunk.judged(self.live, False)[1]

    lane = Lane(())
    members = []
    for n in range(streams):
        live = LiveQuery(b"x:k:1", b"w:k:1", ((b"[v%05d\0\0" % n, b"(v%05d\0\1" % n),))
        if hasattr(lane, "follow"):  # the index of a lane's queries (at 3cefd6b: none)
            lane.follow(live)
        members.append(Member(live))
        lane.members.add(members[-1])  # type: ignore[arg-type]
    times = []
    for round_ in range(5):
        events = []
        for i in range(size):
            marks = ((b"x:k:1", b"v%05d\0\0w%d" % (i % streams, i)), (b"w:k:1", b""))
            events.append((Event(0, (round_ * size + i + 1, 0), b"put", b"w%d" % i, b'"e"', marks), b"t%d" % i, None))
        index = lane.live_index() if hasattr(lane, "live_index") else None
        chunk = Chunk(b"", (), size, events, index) if index is not None else Chunk(b"", (), size, events)
        started = time.perf_counter()
        lane.deliver(chunk)
        times.append((time.perf_counter() - started) * 1000)
    assert sum(member.got for member in members) == 5 * size
    return (
        f"a chunk of {size} events to {streams} distinct live streams: " + ", ".join(f"{t:.1f}" for t in times) + " ms"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.studies._live_fanout", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=4000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1, help="puts per request (POST /v1/_batch when over 1)")
    parser.add_argument("--tree", default=str(ROOT), help="the checkout whose server code runs")
    parser.add_argument("--in-process", action="store_true", help="time a lane's delivery of a chunk, no server")
    parser.add_argument("--chunk", type=int, default=1000, help="events a chunk, with --in-process")
    args = parser.parse_args(argv)
    if args.in_process:
        print(in_process(args.streams, args.chunk))
        return 0
    print(asyncio.run(measure(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
