"""A worker's second warm-up: its hot paths served for real, against the real Redis, in a scratch collection.

``api.warm_up`` compiles the request path against a stand-in Redis, so the
path a write takes through the real one (the scripts' replies, the change
feed's events and nudges, the hot cache's invalidations over its tracking
connection, the link's pool) was still cold when the first client wrote
(issue #60). So after it, and before the worker takes its listening socket,
the worker serves ``requests`` more to a throwaway copy of its application
connected to the real Redis: ``PUT``, ``POST``, ``PATCH`` and ``DELETE``,
conditional requests (``If-Match``, ``If-None-Match``), reads from Redis and
from the hot cache (gzip too), a multi-get (both forms), a list page, a
batch and a read of the change feed.

It never touches a client's data: every document is in a scratch
collection (``scratch_collection``), a name outside the grammar of names
(``handlers.http.validation``), which this process admits only while the
warm-up runs, before it serves; no client can name it, in a request or a
batch. Each warm-up has its own (its pid and a random part): workers warm
up at once, on one host or on several sharing a Redis, and shared, their
writes together passed the feed's cap and one's removal could delete what
another still read. It declares no settings
(nothing in ``jw:{collections}``, no settings change published) and writes
no TTL (no expiry registry). What other workers hear of it is harmless:
the hot cache's invalidations of keys they do not hold, and feed nudges on
a channel no client can follow. Its token is a real one, admin, expiring
in ``TOKEN_SECONDS``, deleted after. Afterwards every key it wrote is
removed: each shard's documents (listed by its index), index, feed stream
and the feed's byte counts, one command per shard (one slot, so Redis
Cluster takes it).

Bounded like the first: ``MAX_SECONDS`` of requests, then the close and
the removal (each Redis call bounded by ``JETWAY_REDIS_TIMEOUT``). A
failure is reported and the worker serves all the same.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import secrets
import time
from typing import Any, Callable, List

from twisted.internet import defer

from api.eager_send import EagerPort
from api.log_writer import LineWriter
from api.observe import Metrics
from api.warm_up import _LARGE, _SMALL, CONNECTIONS, Assemble, WarmUpReport, _close, _Load
from cache import keys
from cache.credentials.tokens import digest_of, new_token, token_key
from cache.feed import position
from cache.redis.topology import connect
from handlers import paths
from handlers.http.validation import admit_collection

SCRATCH_PREFIX = "warm.up"  # a dot: refused by the collection-name grammar, so no client's collection
MAX_SECONDS = 5.0
TOKEN_SECONDS = 60


def warm_up_on_redis(settings: Any, reactor: Any, requests: int, assemble: Assemble) -> defer.Deferred:
    """Serve ``requests`` requests on the scratch collection, then remove it; fires with a ``WarmUpReport``."""
    # What its requests may meet: a 412 on purpose, a 201 or 412 as s3 is there or not, a 404 when another
    # connection deleted first, a 410 once its own writes pushed the feed's start past its cap (its read is
    # from the start; most writes are to s1, one shard's stream: 100,000 / 16 events on a fast machine).
    report = WarmUpReport(label="on Redis", expected=frozenset({200, 201, 204, 404, 410, 412}))
    started = time.monotonic()
    link = connect(settings.redis, reactor, settings.redis_timeout, 1)
    token = new_token()
    scratch = scratch_collection()
    revoke = admit_collection(scratch)
    made = _make_token(link, digest_of(token))
    made.addCallback(lambda _: _serve(settings, reactor, requests, assemble, token, scratch, report, started))
    made.addErrback(lambda failure: setattr(report, "error", f"could not warm up: {failure.getErrorMessage()}"))
    made.addBoth(lambda _: revoke())
    made.addBoth(lambda _: _remove(link, digest_of(token), scratch, report))
    made.addBoth(lambda _: link.close())
    return made.addBoth(lambda _: _finish(report, started))


def scratch_collection() -> str:
    """A scratch collection of its own, so that warm-ups running at once do not share one."""
    return f"{SCRATCH_PREFIX}.{os.getpid()}.{secrets.token_hex(4)}"


def _make_token(link: Any, digest: bytes) -> defer.Deferred:
    key = token_key(digest)
    now = int(time.time())
    record = (b"name", b"warm-up", b"scopes", b"admin", b"rate", b"", b"expires", now + TOKEN_SECONDS, b"created", now)
    return link.pipeline([(b"HSET", key, *record), (b"EXPIRE", key, TOKEN_SECONDS)])


def _serve(
    settings: Any,
    reactor: Any,
    requests: int,
    assemble: Assemble,
    token: str,
    scratch: str,
    report: WarmUpReport,
    started: float,
) -> defer.Deferred:
    """The first warm-up's load and close (``api.warm_up``), on an application connected to the real Redis."""
    closers: List[Callable[[], Any]] = []
    devnull = os.open(os.devnull, os.O_WRONLY)
    lines = LineWriter(devnull, False, lambda _: None)
    warm_settings = dataclasses.replace(settings, oidc_issuers=())
    try:
        app, _ = assemble(warm_settings, reactor, Metrics(), lines, on_shutdown=closers.append)
        http_port = EagerPort(0, app, interface="127.0.0.1", reactor=reactor)
        http_port.startListening()
    except Exception as error:  # reported, and the worker serves
        report.error = f"could not start: {error!r}"
        return _close(reactor, closers, [], devnull, lines, report, started)
    load = _Load(scratch_requests(token, scratch, settings.max_body), requests, report)
    for _ in range(CONNECTIONS):
        reactor.connectTCP("127.0.0.1", http_port.getHost().port, load)
    timeout = reactor.callLater(MAX_SECONDS, load.time_up)
    load.done.addBoth(lambda _: timeout.cancel() if timeout.active() else None)
    return load.done.addBoth(lambda _: _close(reactor, closers, [http_port], devnull, lines, report, started))


def scratch_requests(token: str, scratch: str, max_body: int) -> List[bytes]:
    """The cycle of requests the connections send in turn (no body over ``max_body``)."""
    head = f"Host: localhost\r\nUser-Agent: jetway-warm-up\r\nAccept: */*\r\nAuthorization: Bearer {token}\r\n"
    large = _LARGE if len(_LARGE) <= max_body else _SMALL
    base = paths.COLLECTION.format(collection=scratch)
    start = position.encode(scratch.encode(), (position.ZERO,) * keys.INDEX_SHARDS)  # the feed from its start
    batch = json.dumps(
        {
            "operations": [
                {"op": "put", "collection": scratch, "id": "b1", "document": {"n": 1}},
                {"op": "get", "collection": scratch, "id": "s1"},
                {"op": "patch", "collection": scratch, "id": "b1", "patch": {"n": 2}},
                {"op": "create", "collection": scratch, "document": {"n": 3}},
                {"op": "delete", "collection": scratch, "id": "b1"},
            ]
        }
    ).encode()

    def request(method: str, path: str, extra: str = "", body: bytes = b"", kind: str = "application/json") -> bytes:
        lines = head + extra
        if body or method in ("PUT", "POST", "PATCH"):
            lines += f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body

    # Plain PUTs most: the longest path to compile and the most common write (docs/history/performance.md,
    # "The warm-up"); a machine too busy to serve them all cuts the cycle short, not their share.
    put = request("PUT", f"{base}/s1", body=_SMALL)
    return [
        put,
        request("PUT", f"{base}/s2", body=large),
        put,
        put,
        request("GET", f"{base}/s1"),
        request("GET", f"{base}/s1", "Accept-Encoding: gzip\r\n"),
        request("GET", f"{base}/s2", 'If-None-Match: "warm-up"\r\n'),
        request("PUT", f"{base}/s1", 'If-Match: "warm-up"\r\n', _SMALL),  # 412: the tag does not match
        request("PUT", f"{base}/s3", "If-None-Match: *\r\n", _SMALL),  # 201, or 412 when s3 is there
        request("PATCH", f"{base}/s1", body=b'{"visits":43}', kind="application/merge-patch+json"),
        request("POST", base, body=_SMALL),
        put,
        request("PUT", f"{base}/s2", body=large),
        request("GET", f"{base}?ids=s1,s2,s3"),
        request("POST", paths.MULTI_GET.format(collection=scratch), body=b'{"ids":["s1","s2","s3"]}'),
        request("GET", f"{base}?limit=20"),
        request("POST", paths.BATCH, body=batch),
        request("GET", paths.CHANGES.format(collection=scratch) + f"?since={start}&wait=0&limit=20&include_docs=true"),
        request("DELETE", f"{base}/s3"),  # 204, or 404 when another connection deleted it first
        put,
        put,
    ]


@defer.inlineCallbacks
def _remove(link: Any, digest: bytes, scratch: str, report: WarmUpReport) -> Any:
    """Delete the token and every key of the scratch collection: one command per shard, each shard one slot."""
    name = scratch.encode()
    try:
        yield link.execute(b"DEL", token_key(digest))
        for shard in range(keys.INDEX_SHARDS):
            index = keys.index_key(name, shard)
            ids = yield link.execute(b"ZRANGE", index, 0, -1)
            doomed = [keys.document_key(name, doc_id) for doc_id in ids]
            fed = keys.feed_bytes_key(name, shard)
            yield link.execute(b"DEL", index, keys.feed_key(name, shard), fed, fed + b"s", *doomed)
    except Exception as error:  # reported; what is left is in a collection no client can name
        report.error += f"{'; ' if report.error else ''}scratch collection not removed: {error!r}"


def _finish(report: WarmUpReport, started: float) -> WarmUpReport:
    # The warm-ups' garbage collected now, before the worker serves, not in major steps among its first requests.
    gc.collect()
    report.seconds = time.monotonic() - started
    return report
