"""A worker's warm-up: its common requests served to itself before it takes a client's.

PyPy compiles a path of the worker once it has run it a thousand times or
so, and every compilation stops the worker for milliseconds. A fresh
worker's first second of writes was its compiler's: its ``PUT``s' p99
several times the seconds after's, and less throughput (docs/operations.md,
"Processes"; the figures: docs/performance.md, "The warm-up").

So before a worker adopts the listening socket it serves ``requests``
requests (``JETWAY_WARM_UP``) to a throwaway application built as its
own is (``api.worker.assemble``, the same settings and classes) over
loopback connections: document ``PUT``s (the direct write), a read from
Redis, a read from the hot cache and a gzip read, each for a ~250 B and a
~8 KB document (its gzip variant made and served), and ``/healthz``, with
a token of its own. That application's Redis is ``api.warm_up_redis.WarmUpRedis``, in
this process: nothing reaches the real Redis, and no real token is needed.
Its access lines go to /dev/null and its metrics nowhere. Then each of its
connections is closed, and the worker serves.

Bounded: at most ``MAX_SECONDS`` of requests and ``CLOSE_SECONDS`` to close;
a warm-up that fails or runs out of time is reported and the worker serves
all the same, as cold as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Tuple

from twisted.internet import defer, protocol
from twisted.python.failure import Failure

from api.eager_send import EagerPort
from api.log_writer import LineWriter
from api.observe import Metrics
from api.warm_up_redis import Hashes, WarmUpRedis
from cache import keys
from cache.credentials.jwt_tokens import warm_up as jwt_warm_up
from cache.credentials.tokens import digest_of, new_token, token_key
from cache.documents.variants import FIELDS, Variants
from cache.redis.address import parse_redis_url
from handlers.paths import DOCUMENT

# Long enough for a few thousand requests on a busy machine; a worker that
# has not warmed by then serves cold rather than keep clients waiting.
MAX_SECONDS = 5.0
CLOSE_SECONDS = 2.0
CONNECTIONS = 8
# JWT signature checks before serving, when issuers are configured: about where PyPy's compiled code settles.
JWT_VERIFIES = 3000
COLLECTION = "warm-up"
# Documents with what JSON documents hold (times and URLs, whose colons the
# I-JSON check counts, numbers, booleans, null, nesting), ~250 B and ~8 KB.
_SMALL = json.dumps(
    {
        "id": "w1",
        "name": "Ada Lovelace",
        "email": "ada@example.com",
        "url": "https://example.com/people/w1",
        "updated": "2026-01-01T00:00:00Z",
        "score": 12.5,
        "visits": 42,
        "active": True,
        "manager": None,
        "tags": ["a", "b", "c"],
        "address": {"city": "London", "zip": "N1"},
    },
    separators=(",", ":"),
).encode()
_LARGE = json.dumps(
    {
        "id": "w2",
        "updated": "2026-01-01T00:00:00Z",
        "items": [
            {"sku": f"SKU-{n:05d}", "qty": n, "price": n * 1.25, "ok": n % 3 == 0, "url": f"https://example.com/{n}"}
            for n in range(100)
        ],
    },
    separators=(",", ":"),
).encode()
_ETAG = b'"warm-up"'
_MODIFIED = b"Thu, 01 Jan 2026 00:00:00 GMT"

Assemble = Callable[..., Tuple[Any, Any]]


@dataclass
class WarmUpReport:
    """What a warm-up served: answers by status, its time, and what went wrong (``trouble``)."""

    statuses: Dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    unknown_commands: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    error: str = ""
    label: str = "warm-up"  # what its part of the worker's start line starts with
    # The statuses its requests are meant to get: any other is trouble.
    expected: FrozenSet[int] = frozenset({200})
    # It ran out of time (``MAX_SECONDS``) before its last request: usual on a busy machine, no trouble.
    timed_out: bool = False

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())

    @property
    def trouble(self) -> bool:
        """Whether an operator should look: a status not expected, a command its Redis lacks, an error."""
        return bool(set(self.statuses) - self.expected or self.unknown_commands or self.error)

    def describe(self) -> str:
        """Its part of the worker's start line (``api.worker``): the statuses and what went wrong only if trouble."""
        text = f"{self.label} {self.answered} requests in {self.seconds:.1f} s"
        if self.trouble:
            by_status = ", ".join(f"{count} {status}" for status, count in sorted(self.statuses.items()))
            text += f" ({by_status or 'none answered'})"
        if self.unknown_commands:
            text += f"; its Redis was asked what it does not answer: {' '.join(self.unknown_commands)}"
        if self.notes:
            text += "; " + "; ".join(self.notes)
        if self.error:
            text += f"; stopped: {self.error}"
        return text


def warm_up(settings: Any, reactor: Any, requests: int, assemble: Assemble) -> defer.Deferred:
    """Serve ``requests`` requests to a throwaway copy of the worker's application; fires with a ``WarmUpReport``.

    It fails only when it cannot listen on the loopback interface; whatever
    goes wrong after that is in the report.
    """
    report = WarmUpReport()
    started = time.monotonic()
    redis = WarmUpRedis({})
    redis_port = reactor.listenTCP(0, redis, interface="127.0.0.1")
    closers: List[Callable[[], Any]] = []
    devnull = os.open(os.devnull, os.O_WRONLY)
    lines = LineWriter(devnull, False, lambda _: None)
    warm_settings = dataclasses.replace(
        settings,
        redis=parse_redis_url(f"redis://127.0.0.1:{redis_port.getHost().port}/0"),
        redis_url=f"redis://127.0.0.1:{redis_port.getHost().port}/0",
        oidc_issuers=(),  # the throwaway application fetches no issuer's keys; JWTs are warmed below
    )
    try:
        app, _ = assemble(warm_settings, reactor, Metrics(), lines, on_shutdown=closers.append)
        http_port = EagerPort(0, app, interface="127.0.0.1", reactor=reactor)
        http_port.startListening()
    except Exception as error:  # reported, and the worker serves cold
        report.error = f"could not start: {error!r}"
        return _close(reactor, closers, [redis_port], devnull, lines, report, started)
    token = new_token()
    redis.hashes.update(_hashes(digest_of(token), warm_settings))
    load = _Load(_requests(token, settings.max_body), requests, report)
    for _ in range(CONNECTIONS):
        reactor.connectTCP("127.0.0.1", http_port.getHost().port, load)
    timeout = reactor.callLater(MAX_SECONDS, load.time_up)
    load.done.addBoth(lambda _: timeout.cancel() if timeout.active() else None)
    load.done.addBoth(lambda _: report.unknown_commands.extend(sorted(name.decode() for name in redis.unknown)))
    ports = [http_port, redis_port]
    if settings.oidc_issuers:
        # The first JWTs' signature checks cost several times a warm one until PyPy compiled them.
        load.done.addBoth(lambda _: report.notes.append(f"JWT verifies: {jwt_warm_up(JWT_VERIFIES):.2f} s"))
    return load.done.addBoth(lambda _: _close(reactor, closers, ports, devnull, lines, report, started))


def _hashes(digest: bytes, settings: Any) -> Hashes:
    """What the warm-up's Redis holds: its token (admin, no rate), and its two documents as stored."""
    hashes: Hashes = {
        token_key(digest): {
            b"name": b"warm-up",
            b"scopes": b"admin",
            b"rate": b"",
            b"expires": b"0",
            b"created": b"%d" % time.time(),
        }
    }
    variants = Variants(settings.compress_min_bytes)
    for doc_id, body in ((b"w1", _SMALL), (b"w2", _LARGE)):
        stored = {b"b": body, b"e": _ETAG, b"m": _MODIFIED}
        stored.update((FIELDS[coding], data) for coding, data in variants.encode(body))
        hashes[keys.document_key(COLLECTION.encode(), doc_id)] = stored
    return hashes


def _requests(token: str, max_body: int) -> List[bytes]:
    """The requests each connection sends in turn, as a client sends them (no document over ``max_body``)."""
    auth = f"Authorization: Bearer {token}\r\n".encode()
    requests = []
    for doc_id, body in (("w1", _SMALL), ("w2", _LARGE)):
        if len(body) > max_body:
            continue  # a 413 warms nothing that matters
        path = DOCUMENT.format(collection=COLLECTION, id=doc_id).encode()
        head = b"Host: localhost\r\nUser-Agent: jetway-warm-up\r\nAccept: */*\r\n" + auth
        put = b"PUT %s HTTP/1.1\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        # Three writes to a read: the write's path is the longest to compile (the
        # checks, the script's arguments, its reply, the invalidation after it);
        # with one write per read, the first second's PUTs had a higher p99
        # (docs/history/performance.md, "The warm-up").
        requests += [put % (path, head, len(body), body)] * 3
        read = b"GET %s HTTP/1.1\r\n%s\r\n" % (path, head)
        requests += (read, read, read.replace(b"\r\n\r\n", b"\r\nAccept-Encoding: gzip\r\n\r\n"))
    requests.append(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return requests


class _Load(protocol.ClientFactory):
    """Connections that each send a request, read its answer and send the next, until ``total`` are answered."""

    def __init__(self, requests: List[bytes], total: int, report: WarmUpReport) -> None:
        self.requests = requests
        self.total = total
        self.report = report
        self.sent = 0
        self.clients: List[_Client] = []
        self.done: defer.Deferred = defer.Deferred()

    def buildProtocol(self, addr: Any) -> _Client:
        client = _Client(self)
        self.clients.append(client)
        return client

    def clientConnectionFailed(self, connector: Any, reason: Any) -> None:
        self.stop(f"could not connect: {reason.getErrorMessage()}")

    def next_request(self) -> bytes:
        """The next request to send, or b"" when ``total`` have been sent."""
        if self.sent >= self.total or self.done.called:
            return b""
        self.sent += 1
        return self.requests[self.sent % len(self.requests)]

    def answered(self, status: int) -> None:
        self.report.statuses[status] = self.report.statuses.get(status, 0) + 1
        if self.report.answered >= self.total:
            self.stop()

    def time_up(self) -> None:
        self.report.timed_out = True
        self.stop()

    def stop(self, why: str = "") -> None:
        if self.done.called:
            return
        self.report.error = why
        for client in self.clients:
            client.transport.loseConnection()
        self.done.callback(None)


class _Client(protocol.Protocol):
    def __init__(self, load: _Load) -> None:
        self.load = load
        self.buffer = b""

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)  # as the clients of a gateway (wrk, browsers) do
        self._send()

    def _send(self) -> None:
        request = self.load.next_request()
        if request:
            self.transport.write(request)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].split(b"\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.load.answered(int(head[0].split(b" ")[1]))
            self._send()


def _close(
    reactor: Any,
    closers: List[Callable[[], Any]],
    ports: List[Any],
    devnull: int,
    lines: LineWriter,
    report: WarmUpReport,
    started: float,
) -> defer.Deferred:
    """Close everything the warm-up opened; fires with the report once they are closed."""
    no_longer = getattr(reactor, "no_longer_after_each_poll", None)
    closing = [defer.maybeDeferred(close) for close in closers]
    closing += [defer.maybeDeferred(port.stopListening) for port in ports]

    def closed(outcome: Any) -> WarmUpReport:
        if isinstance(outcome, Failure):  # a busy machine's, most likely: the worker serves all the same
            report.notes.append(f"its connections not closed in {CLOSE_SECONDS:g} s")
        if no_longer is not None:  # the warm-up's access log, registered by its application
            no_longer(lines.flush)
        os.close(devnull)
        report.seconds = time.monotonic() - started
        return report

    # Bounded too: a worker serves after the warm-up whatever its connections do.
    all_closed = defer.DeferredList(closing, consumeErrors=True).addTimeout(CLOSE_SECONDS, reactor)
    return all_closed.addBoth(closed)
