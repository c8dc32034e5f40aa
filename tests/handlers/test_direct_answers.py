"""The document read's and replace's pipelines (handlers/document_answers.py), run by the connection.

The unit tests run the read's pipeline over a live hot cache, and over a
link whose replies the test gives: what it answers at once, what waits,
and the bytes the connection sends. The end-to-end tests send the
same raw requests to three servers on one Redis: one with the hot cache
(hot reads), one without (direct reads from Redis) and one with direct
answers off (every request through Cyclone's handlers), and compare the
responses byte for byte but for ``Date``, a made-up ``X-Request-ID`` and a
write's new validators; the first two servers' ``jetway_direct_answers_total``
says which were answered directly, and as what.
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import requests
from twisted.internet import defer

from cache import keys
from cache.credentials.tokens import TokenRecord, digest_of
from cache.documents.store import Document, DocumentStore
from cache.errors import RedisUnavailable
from cache.hot.cache import HotCache
from handlers.document_answers import HOT_READ, REDIS_READ, WRITE, DocumentAnswers
from handlers.health import HEALTH
from handlers.http.auth import Gate
from handlers.http.cors import CorsPolicy
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError
from handlers.http.negotiation import Negotiator
from handlers.http.reply import Reply
from handlers.pipeline import Exchange, run
from tests.handlers.http.test_auth_digests import RecordTable
from tests.support import JetwayServer

SMALL = b'{"name":"ada","langs":["en","fr"]}'
LARGE = b'{"text":"' + b"lovelace " * 400 + b'"}'  # over the size that stores a gzip variant
HUGE = b'{"text":"' + b"babbage " * 2500 + b'"}'  # larger than one of the worker's socket reads
ORIGIN = "https://app.example"
MODIFIED = b"Mon, 23 Nov 2026 10:00:00 GMT"

# ---------------------------------------------------------------- unit tests


def live_store(*documents: Tuple[bytes, bytes, Document]) -> DocumentStore:
    """A store whose hot cache holds ``documents`` (collection, id, document); no Redis behind it."""
    return DocumentStore(None, hot=holding(*documents))  # type: ignore[arg-type]


def holding(*documents: Tuple[bytes, bytes, Document]) -> HotCache:
    """A hot cache that holds ``documents`` (collection, id, document)."""
    hot = HotCache(64 << 20)
    hot.up()
    for collection, doc_id, document in documents:
        key = keys.document_key(collection, doc_id)
        for _ in range(2):  # a key fills on its second miss
            assert hot.get(key) is None
            ticket = hot.reserve(key)
        hot.fill(key, ticket, document, -1)
    return hot


class Reader:
    """The document read's pipeline over ``store``, and the bytes the connection sends for its reply."""

    def __init__(self, store: DocumentStore, gate: Optional[Gate] = None) -> None:
        gate = gate or Gate(None, None, enabled=False)  # type: ignore[arg-type]
        self.answers = DocumentAnswers(store, gate, None, Negotiator(), "no-cache", 1 << 20)
        self.cors = CorsPolicy((ORIGIN,))
        self.ids = iter(range(1000))

    def answer(self, method: str, target: str, headers: Dict[str, str]) -> Any:
        path, _, query = target.partition("?")
        exchange = Exchange(method, path, query, path.split("/")[2:], headers, b"", f"id{next(self.ids)}")
        self.exchange = exchange
        return run(self.answers.replace if method == "PUT" else self.answers.read, exchange)

    def sent(self, reply: Reply, method: str = "GET", headers: Optional[Dict[str, str]] = None) -> bytes:
        cors = self.cors.response_lines((headers or {}).get("Origin"))
        head = reply.head("HTTP/1.1", "Thu, 26 Nov 2026 04:00:00 GMT", self.exchange.request_id, None, cors)
        return head if method == "HEAD" or reply.status == 304 else head + reply.body


@pytest.fixture
def reader() -> Reader:
    return Reader(live_store((b"people", b"ada", Document(SMALL, b'"e1"', MODIFIED))))


def test_a_cached_document_is_answered_at_once_with_the_handlers_head_and_its_bytes(reader):
    reply = reader.answer("GET", "/v1/people/ada", {})
    assert isinstance(reply, Reply) and (reply.status, reply.kind) == (200, HOT_READ)
    assert reader.sent(reply) == (
        b"HTTP/1.1 200 OK\r\nServer: jetway\r\nContent-Type: application/json\r\n"
        b"Date: Thu, 26 Nov 2026 04:00:00 GMT\r\nX-Request-ID: id0\r\nCache-Control: no-cache\r\n"
        b'ETag: "e1"\r\nLast-Modified: '
        + MODIFIED
        + b"\r\nContent-Length: %d\r\n" % len(SMALL)
        # The allowed origins are listed, so a response to any other (or none) says it varies by Origin.
        + b"Vary: Origin\r\n\r\n"
        + SMALL
    )


def test_head_gets_the_same_head_and_no_body(reader):
    get = reader.sent(reader.answer("GET", "/v1/people/ada", {}))
    head = reader.sent(reader.answer("HEAD", "/v1/people/ada", {}), "HEAD")
    assert head == get[: -len(SMALL)].replace(b"id0", b"id1")


def test_a_matching_if_none_match_is_a_304_without_a_body(reader):
    reply = reader.answer("GET", "/v1/people/ada", {"If-None-Match": '"e1"'})
    sent = reader.sent(reply)
    assert sent.startswith(b"HTTP/1.1 304 Not Modified\r\n") and sent.endswith(b"\r\n\r\n")
    assert b"Content-Length" not in sent and b"Content-Type" not in sent and b'ETag: "e1"' in sent


def test_a_client_id_is_kept_and_an_allowed_origin_gets_its_cors_lines(reader):
    headers = {"X-Request-ID": "mine-1", "Origin": ORIGIN}
    reply = reader.answer("GET", "/v1/people/ada", headers)
    reader.exchange.request_id = "mine-1"  # the connection's choice (request_id_of): the client's, when sane
    sent = reader.sent(reply, headers=headers)
    assert b"X-Request-ID: mine-1\r\n" in sent
    assert f"Access-Control-Allow-Origin: {ORIGIN}\r\n".encode() in sent


@pytest.mark.parametrize(
    "target, headers, status",
    [
        ("/v1/People/ada", {}, 400),  # a bad name
        ("/v1/people/..", {}, 400),  # a bad id
        ("/v1/people/ada", {"Accept-Encoding": "identity;q=0"}, 406),
    ],
)
def test_a_refused_read_is_answered_at_once_with_its_problem(reader, target, headers, status):
    reply = reader.answer("GET", target, headers)
    assert isinstance(reply, Reply) and (reply.status, reply.kind) == (status, "error")
    assert reply.content_type == "application/problem+json" and ("Cache-Control", "no-store") in reply.headers


class AnsweredLink:
    """Stands for Redis in a unit test: keeps each command sent, for the test to answer."""

    def __init__(self) -> None:
        self.sent: List[Tuple[Tuple[bytes, ...], defer.Deferred]] = []

    def execute(self, *command: bytes) -> defer.Deferred:
        self.sent.append((command, defer.Deferred()))
        return self.sent[-1][1]

    def pipeline(self, commands: List[Tuple[bytes, ...]]) -> defer.Deferred:
        return self.execute(*commands[0])  # a read that fills the hot cache: the read, and the key's PTTL


def outcome(pending: defer.Deferred) -> Reply:
    fired: List[Reply] = []
    pending.addCallback(fired.append)
    return fired[0]


@pytest.fixture
def link() -> AnsweredLink:
    return AnsweredLink()


@pytest.fixture
def from_redis(link) -> Reader:
    return Reader(DocumentStore(link))  # type: ignore[arg-type]


def test_a_document_not_held_is_read_from_redis_and_answered_as_a_held_one_is(reader, link, from_redis):
    pending = from_redis.answer("GET", "/v1/people/ada", {})
    assert is_deferred(pending)
    assert [command[:2] for command, _ in link.sent] == [(b"HMGET", keys.document_key(b"people", b"ada"))]
    link.sent[0][1].callback([SMALL, b'"e1"', MODIFIED, None])
    reply = outcome(pending)
    assert (reply.status, reply.kind) == (200, REDIS_READ)
    assert from_redis.sent(reply) == reader.sent(reader.answer("GET", "/v1/people/ada", {}))


@pytest.mark.parametrize(
    "reply, headers, status",
    [
        ([None, None, None, None], {}, 404),
        ([SMALL, b'"e1"', MODIFIED, None], {"Accept-Encoding": "identity;q=0"}, 406),
    ],
)
def test_what_redis_gives_but_a_document_is_answered_with_its_problem(from_redis, link, reply, headers, status):
    pending = from_redis.answer("GET", "/v1/people/ada", headers)
    link.sent[0][1].callback(reply)
    answered = outcome(pending)
    assert (answered.status, answered.content_type) == (status, "application/problem+json")


def test_a_failed_read_is_answered_with_the_failures_problem(from_redis, link):
    pending = from_redis.answer("GET", "/v1/people/ada", {})
    link.sent[0][1].errback(RedisUnavailable("lost"))
    reply = outcome(pending)
    assert reply.status == 503 and ("Retry-After", "1") in reply.headers


def test_a_fresh_copy_is_read_from_redis_though_the_document_is_held(link):
    hot = holding((b"people", b"ada", Document(SMALL, b'"e1"', MODIFIED)))
    store = DocumentStore(link, hot=hot)
    assert is_deferred(Reader(store).answer("GET", "/v1/people/ada", {"Cache-Control": "no-cache"}))
    assert len(link.sent) == 1 and hot.hits == 0


def test_a_read_from_redis_counts_one_miss_and_a_hot_read_one_hit(link):
    hot = holding((b"people", b"ada", Document(SMALL, b'"e1"', MODIFIED)))
    store = DocumentStore(link, hot=hot)
    hits, misses = hot.hits, hot.misses
    reader = Reader(store)
    assert isinstance(reader.answer("GET", "/v1/people/ada", {}), Reply)
    assert is_deferred(reader.answer("GET", "/v1/people/bob", {}))
    assert (hot.hits - hits, hot.misses - misses) == (1, 1)


def test_a_token_known_valid_is_admitted_without_waiting_and_its_rate_step_rides_with_the_read():
    """What makes the fast path: no Deferred for a known token; a rated one's step is sent with the read."""

    def record(token: str, scopes: Tuple[str, ...], rate: str = "") -> TokenRecord:
        return TokenRecord(digest=digest_of(token), name=token, scopes=scopes, rate=rate, expires=0, created=0)

    records = [record("jw_reader", ("read:people",)), record("jw_rated", ("read:*",), rate="10/s")]
    gate = Gate(RecordTable({r.digest: r for r in records}), None, enabled=True)  # type: ignore[arg-type]
    assert is_deferred(gate.grant_or_wait("Bearer jw_unknown", "people", False, True))  # not held: looked up
    granted = gate.grant_or_wait("Bearer jw_reader", "people", False, True)
    assert not is_deferred(granted) and granted.pending_rate is None
    rated = gate.grant_or_wait("Bearer jw_rated", "people", False, True)
    assert not is_deferred(rated) and rated.pending_rate is not None
    with pytest.raises(ApiError) as refused:
        gate.grant_or_wait("Bearer jw_reader", "orders", False, True)
    assert refused.value.status_code == 403


# ---------------------------------------------------------- end to end

_DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")
_MADE_ID = re.compile(rb"\r\nX-Request-ID: [0-9a-f]{32}\r\n")
ENV = {"JETWAY_CORS_ORIGINS": ORIGIN, "JETWAY_ACCESS_LOG": "on"}
STRICT = {
    "schema": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    "max_bytes": 64,
}


class Servers:
    """Three servers on one Redis, one worker each, all with authorization."""

    def __init__(self, hot: JetwayServer, cold: JetwayServer, full: JetwayServer) -> None:
        self.hot = hot  # the hot cache on: direct reads from it, and from Redis when it does not hold one
        self.cold = cold  # the hot cache off: every direct read from Redis
        self.full = full  # direct reads off: every read through DocumentHandler, from Redis


@pytest.fixture(scope="module")
def servers(redis_server, tmp_path_factory) -> Iterator[Servers]:
    directory = tmp_path_factory.mktemp("direct_read")
    started: List[JetwayServer] = []
    try:
        for name, env in (
            ("hot", ENV),
            ("cold", {**ENV, "JETWAY_HOT_CACHE_BYTES": "0"}),
            ("full", {**ENV, "JETWAY_HOT_CACHE_BYTES": "0", "JETWAY_DIRECT_ANSWERS": "off"}),
        ):
            started.append(JetwayServer(redis_server.url, directory / f"{name}.log", env=env, auth=True))
            started[-1].start(["--workers", "1"])
        yield Servers(*started)
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def seeded(servers, redis_server) -> Dict[str, str]:
    """Documents and tokens on a flushed Redis, once for the module (nothing here writes but the
    WRONGTYPE key); every server has read each document twice with each token (the hot one caches it)."""
    with redis_server.client() as client:
        client.flushall()
        client.rpush(keys.document_key(b"people", b"listy"), b"not a hash")  # HMGET's WRONGTYPE
    hot = servers.hot
    tokens = {
        "admin": hot.make_token("admin", "admin"),
        "reader": hot.make_token("reader", "read:people", "read:slow"),
        "rated": hot.make_token("rated", "read:*", rate="1000/s"),
        "writer": hot.make_token("writer", "write:people", "write:strict"),
    }
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    settings = {"cache_control": "private, max-age=60"}
    assert requests.put(hot.url("/v1/_collections/slow"), json=settings, headers=admin, timeout=10).ok
    assert requests.put(hot.url("/v1/_collections/strict"), json=STRICT, headers=admin, timeout=10).ok
    documents = (
        ("/v1/people/ada", SMALL),
        ("/v1/people/big", LARGE),
        ("/v1/slow/one", SMALL),
        ("/v1/people/huge", HUGE),
    )
    for path, body in documents:
        headers = {**admin, "Content-Type": "application/json"}
        assert requests.put(hot.url(path), data=body, headers=headers, timeout=10).status_code == 201
        for server in (servers.hot, servers.cold, servers.full):
            for token in tokens.values():
                for _ in range(2):
                    requests.get(server.url(path), headers={"Authorization": f"Bearer {token}"}, timeout=10)
    for server in (servers.hot, servers.cold, servers.full):  # each token and collection known to each
        for token in ("admin", "writer"):
            for collection in ("people", "strict"):
                headers = {"Authorization": f"Bearer {tokens[token]}", "Content-Type": "application/json"}
                path = f"/v1/{collection}/seed"
                assert requests.put(server.url(path), data=b'{"name":"s"}', headers=headers, timeout=10).ok
    return tokens


def exchange(server: JetwayServer, *requests_: bytes) -> bytes:
    """The responses to raw requests sent at once on one connection, each read whole by its length."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"".join(requests_))
        received = b""
        responses: List[bytes] = []
        for request in requests_:
            while b"\r\n\r\n" not in received:
                received += _more(sock)
            end = received.index(b"\r\n\r\n") + 4
            head = received[:end]
            length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
            has_body = length is not None and not request.startswith(b"HEAD ")
            end += int(length.group(1)) if has_body else 0
            while len(received) < end:
                received += _more(sock)
            responses.append(received[:end])
            received = received[end:]
        assert received == b"", "more than the responses came"
        return b"".join(responses)


def _more(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, "the connection closed before the response was whole"
    return chunk


def normalized(response: bytes) -> bytes:
    return _MADE_ID.sub(b"\r\nX-Request-ID: (made)\r\n", _DATE.sub(b"\r\nDate: (now)\r\n", response))


def direct_answers(server: JetwayServer) -> Tuple[float, float, float, float]:
    """What the server answered without Cyclone so far: (hot reads, reads from Redis, writes, problems)."""
    # One worker: the scrape is answered by the worker that served, which flushes its counts first.
    text = requests.get(server.url("/metrics"), timeout=10).text
    return tuple(_count(text, kind) for kind in (HOT_READ, REDIS_READ, WRITE, "error"))  # type: ignore[return-value]


def _count(metrics: str, kind: str) -> float:
    found = re.search(rf'^jetway_direct_answers_total{{kind="{kind}"}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def plus(counts: Tuple[float, ...], *more: float) -> Tuple[float, ...]:
    return tuple(count + extra for count, extra in zip(counts, more))


def raw(method: str, path: str, token: Optional[str], *lines: str, version: str = "HTTP/1.1") -> bytes:
    auth = [f"Authorization: Bearer {token}"] if token else []
    return "\r\n".join([f"{method} {path} {version}", "Host: test", *auth, *lines, "", ""]).encode()


# Requests the direct read answers: (method, path, token, header lines).
DIRECT = [
    ("GET", "/v1/people/ada", "admin", ()),
    ("HEAD", "/v1/people/ada", "admin", ()),
    ("GET", "/v1/people/ada", "reader", ()),
    ("GET", "/v1/people/ada", "admin", ("X-Request-ID: client-chosen.1",)),
    ("GET", "/v1/people/ada", "admin", ("X-Request-ID: not valid!",)),  # a new one made instead
    ("GET", "/v1/people/ada", "admin", (f"Origin: {ORIGIN}",)),
    ("GET", "/v1/people/ada", "admin", ("Origin: https://elsewhere.example",)),
    ("GET", "/v1/people/ada", "admin", ("Accept-Encoding: gzip",)),
    ("GET", "/v1/people/big", "admin", ("Accept-Encoding: gzip, br",)),
    ("HEAD", "/v1/people/big", "admin", ("Accept-Encoding: gzip",)),
    ("GET", "/v1/people/big", "admin", ()),
    ("GET", "/v1/people/big", "admin", ("Accept-Encoding: gzip", f"Origin: {ORIGIN}")),
    ("GET", "/v1/people/ada", "admin", ("If-None-Match: *",)),
    ("GET", "/v1/people/ada", "admin", ('If-None-Match: "nope", W/"nope2"',)),
    ("GET", "/v1/people/ada", "admin", ("If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT",)),
    ("GET", "/v1/people/ada", "admin", ("If-Modified-Since: Fri, 01 Jan 2000 00:00:00 GMT",)),
    ("GET", "/v1/people/ada", "admin", ("If-Modified-Since: not a date",)),
    ("GET", "/v1/slow/one", "admin", ()),  # the collection's own Cache-Control
    ("GET", "/v1/people/huge", "admin", ()),
    ("GET", "/v1/people/huge", "admin", ("Accept-Encoding: gzip",)),
    ("GET", "/v1/slow/one", "reader", ("If-Modified-Since: Fri, 01 Jan 2100 00:00:00 GMT",)),
]
# Requests the pipeline answers with a problem: the same as the handler's, counted as "error".
PROBLEMS = [
    ("GET", "/v1/people/ada", None, ()),
    ("GET", "/v1/people/ada", "nobody", ()),
    ("GET", "/v1/orders/ada", "reader", ()),
    ("GET", "/v1/people/nobody", "admin", ()),  # read from Redis: the 404
    ("GET", "/v1/people/listy", "admin", ()),  # read from Redis: WRONGTYPE's 502
    ("GET", "/v1/People/ada", "admin", ()),
    ("GET", "/v1/people/ada", "admin", ("Accept-Encoding: identity;q=0",)),
]
# Reads the pipeline answers that a hot read cannot: a rate step rides with a read from Redis.
FROM_REDIS = [
    ("GET", "/v1/people/ada", "rated", ()),
]
# Reads whose path Cyclone would see differently: the route's own unescaping, its query ignored.
ROUTED = [
    ("GET", "/v1/people/ada?x=1", "admin", ()),
    ("GET", "/v1/people/%61da", "admin", ()),
]


@pytest.mark.parametrize("method, path, token, lines", DIRECT)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_direct_read_answers_exactly_as_the_handler_would(servers, seeded, source, method, path, token, lines):
    server = getattr(servers, source)
    request = raw(method, path, seeded[token], *lines)
    counted = (1, 0, 0, 0) if source == "hot" else (0, 1, 0, 0)
    # A hot read that met its worker's invalidations lagging past their bound (the worker was
    # paused: PyPy compiling, a loaded machine) rightly reads Redis: asked again, up to 3 times.
    for _ in range(3 if source == "hot" else 1):
        before = direct_answers(server)
        answered = normalized(exchange(server, request))
        if direct_answers(server) == plus(before, *counted):
            break
    assert direct_answers(server) == plus(before, *counted), "not answered directly"
    assert answered == normalized(exchange(servers.full, request))


def test_a_request_for_a_fresh_copy_is_answered_directly_from_redis(servers, seeded):
    request = raw("GET", "/v1/people/ada", seeded["admin"], "Cache-Control: no-cache")
    before = direct_answers(servers.hot)
    answered = normalized(exchange(servers.hot, request))
    assert direct_answers(servers.hot) == plus(before, 0, 1, 0, 0)
    assert answered == normalized(exchange(servers.full, request))


@pytest.mark.parametrize("method, path, token, lines", PROBLEMS)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_refused_read_is_answered_directly_with_the_handlers_problem(
    servers, seeded, source, method, path, token, lines
):
    server = getattr(servers, source)
    request = raw(method, path, seeded.get(token, token), *lines)
    before = direct_answers(server)
    answered = normalized(exchange(server, request))
    assert direct_answers(server) == plus(before, 0, 0, 0, 1)
    assert answered == normalized(exchange(servers.full, request))


@pytest.mark.parametrize("method, path, token, lines", FROM_REDIS + ROUTED)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_rated_escaped_or_queried_read_is_answered_directly_as_the_handler_would(
    servers, seeded, source, method, path, token, lines
):
    server = getattr(servers, source)
    request = raw(method, path, seeded[token], *lines)
    before = direct_answers(server)
    answered = normalized(exchange(server, request))
    hot = source == "hot" and (method, path, token, lines) in ROUTED
    assert direct_answers(server) == plus(before, *((1, 0, 0, 0) if hot else (0, 1, 0, 0)))
    assert answered == normalized(exchange(servers.full, request))


@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_read_on_a_closing_connection_is_left_to_the_handler(servers, seeded, source):
    server = getattr(servers, source)
    request = raw("GET", "/v1/people/ada", seeded["admin"], "Connection: close")
    before = direct_answers(server)
    assert normalized(exchange(server, request)) == normalized(exchange(servers.full, request))
    assert direct_answers(server) == before


def test_the_full_server_answers_nothing_directly(servers, seeded):
    before = direct_answers(servers.full)
    exchange(servers.full, raw("GET", "/v1/people/ada", seeded["admin"]))
    assert direct_answers(servers.full) == before == (0, 0, 0, 0)


@pytest.mark.parametrize("source", ["hot", "cold"])
def test_an_http_1_0_read_is_left_to_the_handler(servers, seeded, source):
    server = getattr(servers, source)
    request = raw("GET", "/v1/people/ada", seeded["admin"], "Connection: keep-alive", version="HTTP/1.0")
    before = direct_answers(server)
    assert normalized(exchange(server, request)) == normalized(exchange(servers.full, request))
    assert direct_answers(server) == before


@pytest.mark.parametrize("source", ["hot", "cold"])
def test_pipelined_direct_reads_and_others_are_answered_in_order(servers, seeded, source):
    server = getattr(servers, source)
    token = seeded["admin"]
    requests_ = [raw("GET", "/v1/people/ada", token), raw("GET", "/v1/people/nobody", token)]
    requests_ += [raw("GET", "/v1/people/big", token, "Accept-Encoding: gzip"), raw("HEAD", "/v1/people/big", token)]
    requests_ += [raw("GET", "/v1/people/listy", token), raw("GET", "/healthz", None)]
    requests_.append(raw("GET", "/v1/people/ada", token, "Connection: close"))
    assert normalized(exchange(server, *requests_)) == normalized(exchange(servers.full, *requests_))


# ---------------------------------------------------------------- writes

_VALIDATORS = re.compile(rb'\r\nETag: "[^"]*"\r\nLast-Modified: [^\r]*\r\n')


def put(path: str, token: Optional[str], body: bytes, *lines: str) -> bytes:
    typed = () if any(line.startswith("Content-Type:") for line in lines) else ("Content-Type: application/json",)
    return raw("PUT", path, token, *typed, *lines, f"Content-Length: {len(body)}") + body


def written(response: bytes) -> bytes:
    """A write's response with what every write makes anew (its ETag and Last-Modified) left out."""
    return normalized(_VALIDATORS.sub(b"\r\n(validators)\r\n", response))


def write_twice(server: JetwayServer, redis_server, path: str, request: bytes) -> bytes:
    """The responses to ``request`` sent twice, the document gone first (a create, then a replace)."""
    collection, doc_id = path.split("/")[2:4]
    with redis_server.client() as client:
        client.delete(keys.document_key(collection.encode(), doc_id.encode()))
    return written(exchange(server, request)) + written(exchange(server, request))


# Writes the replace's pipeline answers on the connection: (token, path, body, header lines, 201 or a problem).
WRITES = [
    ("admin", "/v1/people/w", SMALL, (), 201),
    ("writer", "/v1/people/w", SMALL, (), 201),
    ("admin", "/v1/people/w", LARGE, ("X-Request-ID: client-chosen.2", f"Origin: {ORIGIN}"), 201),
    ("writer", "/v1/strict/w", b'{"name":"ok"}', ("Content-Type: application/json; charset=utf-8",), 201),
    ("writer", "/v1/people/w", HUGE, (), 201),
    ("admin", "/v1/people/w?ttl=60", SMALL, (), 201),
    ("admin", "/v1/people/w", SMALL, ("If-None-Match: *",), 201),  # then a 412
    ("admin", "/v1/people/w", SMALL, ('If-Match: "nope"',), 412),
    ("admin", "/v1/people/w", SMALL, ("If-Unmodified-Since: Fri, 01 Jan 2100 00:00:00 GMT",), 201),
    ("writer", "/v1/slow/w", SMALL, (), 403),  # no write scope
    ("admin", "/v1/people/w", b'{"name":', (), 400),
    ("admin", "/v1/people/w", b"[1, 2]", (), 400),
    ("admin", "/v1/people/w", SMALL, ("Content-Type: text/plain",), 415),
    ("reader", "/v1/people/w", SMALL, (), 403),
    (None, "/v1/people/w", SMALL, (), 401),
    ("writer", "/v1/strict/w", b'{"name":5}', (), 422),  # the schema's
    ("writer", "/v1/strict/w", b'{"name":"' + b"x" * 80 + b'"}', (), 413),  # over max_bytes
    ("admin", "/v1/People/w", SMALL, (), 400),
]


@pytest.mark.parametrize("token, path, body, lines, status", WRITES)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_direct_write_answers_exactly_as_the_handler_would(
    servers, seeded, redis_server, source, token, path, body, lines, status
):
    server = getattr(servers, source)
    request = put(path, seeded.get(token, token), body, *lines)
    before = direct_answers(server)
    document = path.partition("?")[0]
    answered = write_twice(server, redis_server, document, request)
    assert answered == write_twice(servers.full, redis_server, document, request)
    assert answered.startswith(b"HTTP/1.1 %d " % status)
    first_written = status == 201
    second_written = first_written and "If-None-Match: *" not in lines
    writes = first_written + second_written
    assert direct_answers(server) == plus(before, 0, 0, writes, 2 - writes)


@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_write_on_a_closing_connection_is_left_to_the_handler(servers, seeded, redis_server, source):
    server = getattr(servers, source)
    request = put("/v1/people/w", seeded["admin"], SMALL, "Connection: close")
    before = direct_answers(server)
    answered = write_twice(server, redis_server, "/v1/people/w", request)
    assert direct_answers(server) == before
    assert answered == write_twice(servers.full, redis_server, "/v1/people/w", request)


def redis_calls(redis_server, *commands: str, counted: str = "calls") -> int:
    """How many of ``commands`` Redis has run so far (``counted="failed_calls"``: how many failed)."""
    with redis_server.client() as client:
        stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get(counted, 0) for name in commands)


@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_failed_direct_write_is_answered_with_its_problem_and_written_once(servers, seeded, redis_server, source):
    server = getattr(servers, source)
    request = put("/v1/people/listy", seeded["admin"], SMALL)  # a list where a document's hash goes: WRONGTYPE
    # Failed script calls: the expiry sweepers of the suite's other collections run scripts of their own meanwhile.
    calls, before = redis_calls(redis_server, "evalsha", "eval", counted="failed_calls"), direct_answers(server)
    answered = exchange(server, request)
    assert redis_calls(redis_server, "evalsha", "eval", counted="failed_calls") == calls + 1, "written again"
    assert direct_answers(server) == plus(before, 0, 0, 0, 1)
    assert answered.startswith(b"HTTP/1.1 502 ")
    assert normalized(answered) == normalized(exchange(servers.full, request))


def test_pipelined_direct_writes_and_reads_are_answered_in_order(servers, seeded, redis_server):
    token = seeded["admin"]
    requests_ = [put("/v1/people/w", token, SMALL), raw("GET", "/v1/people/ada", token)]
    requests_ += [put("/v1/people/w", token, b'{"bad":'), put("/v1/people/w", token, LARGE)]
    requests_.append(raw("GET", "/v1/people/w", token, "Connection: close"))
    answers = []
    for server in (servers.cold, servers.full):
        with redis_server.client() as client:
            client.delete(keys.document_key(b"people", b"w"))
        answers.append(written(exchange(server, *requests_)))
    assert answers[0] == answers[1]


# ---------------------------------------------------------------- draining

# Redis busy for about a second here: longer than the test's wait before the drain, shorter than
# Redis's 5 s busy threshold (after it, Redis answers BUSY) on a machine up to four times slower.
SPIN = "for i = 1, 300000000 do end"


def test_a_read_waiting_for_redis_when_the_worker_drains_is_answered_with_connection_close(
    redis_server, tmp_path, seeded
):
    """A read the connection runs and that waits for Redis while the worker drains ends its connection."""
    # A reply deadline longer than the busy Redis may take on a slow machine (a 504 otherwise).
    env = {"JETWAY_HOT_CACHE_BYTES": "0", "JETWAY_ACCESS_LOG": "on", "JETWAY_REDIS_TIMEOUT": "30"}
    server = JetwayServer(redis_server.url, tmp_path / "drain.log", env=env).start(["--workers", "1"])
    try:
        for _ in range(2):  # the collection's settings known, so the next read is a direct one
            assert requests.get(server.url("/v1/people/ada"), timeout=10).content == SMALL
        reads = redis_calls(redis_server, "hmget")
        spinning = threading.Thread(target=_spin_redis, args=(redis_server,))
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            spinning.start()
            time.sleep(0.2)  # the script has started
            sock.sendall(raw("GET", "/v1/people/ada", None))
            time.sleep(0.3)  # the read waits for Redis
            assert server.process is not None and spinning.is_alive(), "Redis was not busy long enough"
            server.process.send_signal(signal.SIGTERM)  # the worker drains: its connections are closing
            response = b""
            while chunk := sock.recv(65536):
                response += chunk
        spinning.join()
        assert response.startswith(b"HTTP/1.1 200 OK\r\n") and response.endswith(b"\r\n\r\n" + SMALL)
        assert b"\r\nConnection: close\r\n" in response
        assert b"\r\nX-Request-ID: " in response
        assert server.process.wait(30) == 0
        # One read of Redis answered it (the server is gone: its counts with it).
        assert redis_calls(redis_server, "hmget") == reads + 1
    finally:
        server.stop()


def _spin_redis(redis_server) -> None:
    with redis_server.client() as client:
        client.eval(SPIN, 0)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_healthz_is_answered_by_the_connection_as_the_handler_answers_it(servers, method):
    """``/healthz`` runs no handler on a keep-alive connection (issue #60), and its bytes are the handler's."""
    request = raw(method, "/healthz", None)
    counted = lambda: _count(requests.get(servers.hot.url("/metrics"), timeout=10).text, HEALTH)  # noqa: E731
    before = counted()
    answered = normalized(exchange(servers.hot, request))
    assert counted() == before + 1
    assert answered.startswith(b"HTTP/1.1 200 ")
    assert answered.endswith(b'{"status":"ok"}' if method == "GET" else b"\r\n\r\n")
    assert answered == normalized(exchange(servers.full, request))
    # HTTP/1.0 and Connection: close go to the handler, which sends the same reply and closes.
    for left in (raw(method, "/healthz", None, version="HTTP/1.0"), raw(method, "/healthz", None, "Connection: close")):
        before = counted()
        head, _, body = exchange(servers.hot, left).partition(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0] and body == (b'{"status":"ok"}' if method == "GET" else b"")
        assert counted() == before
