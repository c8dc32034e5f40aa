"""handlers.direct_read and direct_write: which requests they answer, and that their bytes are the handler's.

The unit tests drive ``DirectRead.answer`` over a live hot cache, and over
a link whose replies the test gives: what it takes, what it leaves to
``DocumentHandler`` and what it hands over. The end-to-end tests send the
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
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import requests
from twisted.internet import defer
from twisted.python.failure import Failure

from cache import keys
from cache.hot_cache import HotCache
from cache.store import Document, DocumentStore
from cache.tokens import TokenRecord, digest_of
from handlers.direct_answer import HOT_READ, REDIS_READ, WRITE, DirectAnswer, DirectResponder
from handlers.direct_read import DirectRead
from handlers.http.auth import Gate
from handlers.http.cors import CorsPolicy
from handlers.http.deferreds import is_deferred
from handlers.http.negotiation import Negotiator
from tests.support import JetwayServer
from tests.test_auth_digests import RecordTable

SMALL = b'{"name":"ada","langs":["en","fr"]}'
LARGE = b'{"text":"' + b"lovelace " * 400 + b'"}'  # over the size that stores a gzip variant
HUGE = b'{"text":"' + b"babbage " * 2500 + b'"}'  # larger than one of the worker's socket reads
ORIGIN = "https://app.example"
MODIFIED = b"Mon, 23 Nov 2026 10:00:00 GMT"

# ---------------------------------------------------------------- unit tests


def live_store(*documents: Tuple[bytes, bytes, Document]) -> DocumentStore:
    """A store whose hot cache holds ``documents`` (collection, id, document); no Redis behind it."""
    hot = HotCache(64 << 20)
    hot.up()
    for collection, doc_id, document in documents:
        key = keys.document_key(collection, doc_id)
        for _ in range(2):  # a key fills on its second miss
            assert hot.get(key) is None
            ticket = hot.reserve(key)
        hot.fill(key, ticket, document, -1)
    return DocumentStore(None, hot=hot)  # type: ignore[arg-type]


def direct_read(store: DocumentStore, gate: Optional[Gate] = None) -> DirectRead:
    ids = iter(range(1000))
    responder = DirectResponder(
        store,
        gate or Gate(None, None, enabled=False),  # type: ignore[arg-type]
        None,
        CorsPolicy((ORIGIN,)),
        lambda: "Thu, 26 Nov 2026 04:00:00 GMT",
        lambda: f"id{next(ids)}",
    )
    return DirectRead(responder, "no-cache", Negotiator())


@pytest.fixture
def reader() -> DirectRead:
    return direct_read(live_store((b"people", b"ada", Document(SMALL, b'"e1"', MODIFIED))))


def test_a_cached_document_is_answered_with_the_handlers_head_and_its_bytes(reader):
    answer = reader.answer("GET", "/v1/people/ada", {})
    assert answer is not None and (answer.status, answer.request_id) == (200, "id0")
    assert answer.response == (
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
    get, head = reader.answer("GET", "/v1/people/ada", {}), reader.answer("HEAD", "/v1/people/ada", {})
    assert head.response == get.response[: -len(SMALL)].replace(b"id0", b"id1")


def test_a_matching_if_none_match_is_a_304_without_a_body(reader):
    answer = reader.answer("GET", "/v1/people/ada", {"If-None-Match": '"e1"'})
    assert answer.status == 304
    assert answer.response.startswith(b"HTTP/1.1 304 Not Modified\r\n") and answer.response.endswith(b"\r\n\r\n")
    assert b"Content-Length" not in answer.response and b'ETag: "e1"' in answer.response


def test_a_client_id_is_kept_and_an_allowed_origin_gets_its_cors_lines(reader):
    answer = reader.answer("GET", "/v1/people/ada", {"X-Request-ID": "mine-1", "Origin": ORIGIN})
    assert b"X-Request-ID: mine-1\r\n" in answer.response
    assert f"Access-Control-Allow-Origin: {ORIGIN}\r\n".encode() in answer.response


@pytest.mark.parametrize(
    "method, target, headers",
    [
        ("PUT", "/v1/people/ada", {}),
        ("GET", "/v1/people/ada?x=1", {}),  # a query: the handler's to ignore
        ("GET", "/v1/people/%61da", {}),  # escaped: Cyclone unescapes it
        ("GET", "/v1/people/ada/more", {}),
        ("GET", "/v1/people", {}),
        ("GET", "/v1/_get/people", {}),
        ("GET", "/healthz", {}),
        ("GET", "/v1/People/ada", {}),  # a bad name: the handler's 400
        ("GET", "/v1/people/..", {}),  # a bad id: the handler's 400
        ("GET", "/v1/people/ada", {"Accept-Encoding": "identity;q=0"}),  # the handler's 406
    ],
)
def test_anything_else_is_left_to_the_handler(reader, method, target, headers):
    assert reader.answer(method, target, headers) is None


class AnsweredLink:
    """Stands for Redis in a unit test: keeps each command sent, for the test to answer."""

    def __init__(self) -> None:
        self.sent: List[Tuple[Tuple[bytes, ...], defer.Deferred]] = []

    def execute(self, *command: bytes) -> defer.Deferred:
        self.sent.append((command, defer.Deferred()))
        return self.sent[-1][1]

    def pipeline(self, commands: List[Tuple[bytes, ...]]) -> defer.Deferred:
        return self.execute(*commands[0])  # a read that fills the hot cache: the read, and the key's PTTL


def outcome(pending: defer.Deferred) -> DirectAnswer:
    fired: List[DirectAnswer] = []
    pending.addCallback(fired.append)
    return fired[0]


@pytest.fixture
def link() -> AnsweredLink:
    return AnsweredLink()


@pytest.fixture
def from_redis(link) -> DirectRead:
    return direct_read(DocumentStore(link))  # type: ignore[arg-type]


def test_a_document_not_held_is_read_from_redis_and_answered_as_a_held_one_is(reader, link, from_redis):
    pending = from_redis.answer("GET", "/v1/people/ada", {})
    assert [command[:2] for command, _ in link.sent] == [(b"HMGET", keys.document_key(b"people", b"ada"))]
    link.sent[0][1].callback([SMALL, b'"e1"', MODIFIED, None])
    answer = outcome(pending)
    assert (answer.status, answer.kind) == (200, REDIS_READ)
    assert answer.response == reader.answer("GET", "/v1/people/ada", {}).response


@pytest.mark.parametrize(
    "reply, headers",
    [
        ([None, None, None, None], {}),  # no such document: the handler's 404
        ([SMALL, b'"e1"', MODIFIED, None], {"Accept-Encoding": "identity;q=0"}),  # the handler's 406
    ],
)
def test_what_redis_gives_but_a_200_or_304_is_handed_to_the_handler(from_redis, link, reply, headers):
    pending = from_redis.answer("GET", "/v1/people/ada", headers)
    link.sent[0][1].callback(reply)
    answer = outcome(pending)
    assert answer.response is None
    assert answer.outcome == (None if reply[0] is None else Document(SMALL, b'"e1"', MODIFIED))


def test_a_failed_read_is_handed_to_the_handler_as_its_failure(from_redis, link):
    pending = from_redis.answer("GET", "/v1/people/ada", {})
    link.sent[0][1].errback(ConnectionError("lost"))
    answer = outcome(pending)
    assert answer.response is None and isinstance(answer.outcome, Failure)
    assert answer.outcome.check(ConnectionError)


def test_a_fresh_copy_is_read_from_redis_though_the_document_is_held(link):
    store = live_store((b"people", b"ada", Document(SMALL, b'"e1"', MODIFIED)))
    store._link = link
    assert is_deferred(direct_read(store).answer("GET", "/v1/people/ada", {"Cache-Control": "no-cache"}))
    assert len(link.sent) == 1 and store._hot.hits == 0


def test_a_read_from_redis_counts_one_miss_and_a_hot_read_one_hit(link):
    store = live_store((b"people", b"ada", Document(SMALL, b'"e1"', MODIFIED)))
    store._link = link
    hot = store._hot
    hits, misses = hot.hits, hot.misses
    reader = direct_read(store)
    assert isinstance(reader.answer("GET", "/v1/people/ada", {}), DirectAnswer)
    assert is_deferred(reader.answer("GET", "/v1/people/bob", {}))
    assert (hot.hits - hits, hot.misses - misses) == (1, 1)


def test_only_a_token_known_valid_with_read_scope_and_no_rate_is_admitted_at_once():
    def record(token: str, scopes: Tuple[str, ...], rate: str = "") -> TokenRecord:
        return TokenRecord(digest=digest_of(token), name=token, scopes=scopes, rate=rate, expires=0, created=0)

    records = [record("jw_reader", ("read:people",)), record("jw_other", ("read:orders",))]
    records.append(record("jw_rated", ("read:*",), rate="10/s"))
    gate = Gate(RecordTable({r.digest: r for r in records}), None, enabled=True)  # type: ignore[arg-type]
    assert not gate.admits_now("Bearer jw_reader", "people", False)  # not yet known valid: hashed once by the gate
    for token in ("jw_reader", "jw_other", "jw_rated"):
        gate.grant_or_wait(f"Bearer {token}", "orders" if token == "jw_other" else "people", False, True)
    assert gate.admits_now("Bearer jw_reader", "people", False)
    assert not gate.admits_now("Bearer jw_reader", "orders", False)  # no scope: the handler's 403
    assert not gate.admits_now("Bearer jw_rated", "people", False)  # its rate step needs Redis
    assert not gate.admits_now(None, "people", False) and not gate.admits_now("Basic x", "people", False)


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


def direct_answers(server: JetwayServer) -> Tuple[float, float, float]:
    """What the server answered without Cyclone so far: (hot reads, reads from Redis, writes)."""
    # One worker: the scrape is answered by the worker that served, which flushes its counts first.
    text = requests.get(server.url("/metrics"), timeout=10).text
    return tuple(_count(text, kind) for kind in (HOT_READ, REDIS_READ, WRITE))  # type: ignore[return-value]


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
# Requests it leaves or hands to the handler: the same answers all the same.
FULL = [
    ("GET", "/v1/people/ada", None, ()),
    ("GET", "/v1/people/ada", "nobody", ()),
    ("GET", "/v1/orders/ada", "reader", ()),
    ("GET", "/v1/people/ada", "rated", ()),
    ("GET", "/v1/people/nobody", "admin", ()),  # read from Redis, handed over: the 404
    ("GET", "/v1/people/listy", "admin", ()),  # read from Redis, handed over: WRONGTYPE's 502
    ("GET", "/v1/People/ada", "admin", ()),
    ("GET", "/v1/people/ada?x=1", "admin", ()),
    ("GET", "/v1/people/%61da", "admin", ()),
    ("GET", "/v1/people/ada", "admin", ("Accept-Encoding: identity;q=0",)),
    ("GET", "/v1/people/ada", "admin", ("Connection: close",)),
]


@pytest.mark.parametrize("method, path, token, lines", DIRECT)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_direct_read_answers_exactly_as_the_handler_would(servers, seeded, source, method, path, token, lines):
    server = getattr(servers, source)
    request = raw(method, path, seeded[token], *lines)
    before = direct_answers(server)
    answered = normalized(exchange(server, request))
    counted = (1, 0, 0) if source == "hot" else (0, 1, 0)
    assert direct_answers(server) == plus(before, *counted), "not answered directly"
    assert answered == normalized(exchange(servers.full, request))


def test_a_request_for_a_fresh_copy_is_answered_directly_from_redis(servers, seeded):
    request = raw("GET", "/v1/people/ada", seeded["admin"], "Cache-Control: no-cache")
    before = direct_answers(servers.hot)
    answered = normalized(exchange(servers.hot, request))
    assert direct_answers(servers.hot) == plus(before, 0, 1, 0)
    assert answered == normalized(exchange(servers.full, request))


@pytest.mark.parametrize("method, path, token, lines", FULL)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_what_the_direct_read_leaves_is_answered_as_before(servers, seeded, source, method, path, token, lines):
    server = getattr(servers, source)
    request = raw(method, path, seeded.get(token, token), *lines)
    before = direct_answers(server)
    answered = normalized(exchange(server, request))
    assert direct_answers(server) == before
    assert answered == normalized(exchange(servers.full, request))


def test_the_full_server_answers_nothing_directly(servers, seeded):
    before = direct_answers(servers.full)
    exchange(servers.full, raw("GET", "/v1/people/ada", seeded["admin"]))
    assert direct_answers(servers.full) == before == (0, 0, 0)


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


# Writes the direct write answers: (token, collection, body, header lines).
WRITES = [
    ("admin", "people", SMALL, ()),
    ("writer", "people", SMALL, ()),
    ("admin", "people", LARGE, ("X-Request-ID: client-chosen.2", f"Origin: {ORIGIN}")),
    ("writer", "strict", b'{"name":"ok"}', ("Content-Type: application/json; charset=utf-8",)),
    ("writer", "people", HUGE, ()),
    ("writer", "slow", SMALL, ()),  # no write scope: left, the 403
]
# Writes it leaves to the handler: the same answers all the same.
FULL_WRITES = [
    ("admin", "/v1/people/w", SMALL, ("If-None-Match: *",)),
    ("admin", "/v1/people/w", SMALL, ('If-Match: "nope"',)),
    ("admin", "/v1/people/w", SMALL, ("If-Unmodified-Since: Fri, 01 Jan 2100 00:00:00 GMT",)),
    ("admin", "/v1/people/w?ttl=60", SMALL, ()),
    ("admin", "/v1/people/w", b'{"name":', ()),
    ("admin", "/v1/people/w", b"[1, 2]", ()),
    ("admin", "/v1/people/w", SMALL, ("Content-Type: text/plain",)),
    ("reader", "/v1/people/w", SMALL, ()),
    (None, "/v1/people/w", SMALL, ()),
    ("writer", "/v1/strict/w", b'{"name":5}', ()),  # the schema's 422
    ("writer", "/v1/strict/w", b'{"name":"' + b"x" * 80 + b'"}', ()),  # over max_bytes
    ("admin", "/v1/People/w", SMALL, ()),
    ("admin", "/v1/people/w", SMALL, ("Connection: close",)),
]


@pytest.mark.parametrize("token, collection, body, lines", WRITES)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_direct_write_answers_exactly_as_the_handler_would(
    servers, seeded, redis_server, source, token, collection, body, lines
):
    server = getattr(servers, source)
    path = f"/v1/{collection}/w"
    request = put(path, seeded[token], body, *lines)
    before = direct_answers(server)
    answered = write_twice(server, redis_server, path, request)
    allowed = collection != "slow"
    assert direct_answers(server) == plus(before, 0, 0, 2 if allowed else 0)
    assert answered == write_twice(servers.full, redis_server, path, request)
    assert (b"HTTP/1.1 201 Created" in answered) is allowed


@pytest.mark.parametrize("token, path, body, lines", FULL_WRITES)
@pytest.mark.parametrize("source", ["hot", "cold"])
def test_what_the_direct_write_leaves_is_answered_as_before(
    servers, seeded, redis_server, source, token, path, body, lines
):
    server = getattr(servers, source)
    request = put(path, seeded.get(token, token), body, *lines)
    before = direct_answers(server)
    answered = write_twice(server, redis_server, path.partition("?")[0], request)
    assert direct_answers(server) == before
    assert answered == write_twice(servers.full, redis_server, path.partition("?")[0], request)


def redis_calls(redis_server, *commands: str) -> int:
    """How many of ``commands`` Redis has run so far."""
    with redis_server.client() as client:
        stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in commands)


@pytest.mark.parametrize("source", ["hot", "cold"])
def test_a_failed_direct_write_is_answered_by_the_handler_without_writing_again(servers, seeded, redis_server, source):
    server = getattr(servers, source)
    request = put("/v1/people/listy", seeded["admin"], SMALL)  # a list where a document's hash goes: WRONGTYPE
    calls, before = redis_calls(redis_server, "evalsha", "eval"), direct_answers(server)
    answered = exchange(server, request)
    assert redis_calls(redis_server, "evalsha", "eval") == calls + 1, "the handler wrote again"
    assert direct_answers(server) == before
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
    """The direct read cannot send ``Connection: close`` itself: the handler answers it, from the read made."""
    # A reply deadline longer than the busy Redis may take on a slow machine (a 504 otherwise).
    env = {"JETWAY_HOT_CACHE_BYTES": "0", "JETWAY_ACCESS_LOG": "on", "JETWAY_REDIS_TIMEOUT": "30"}
    server = JetwayServer(redis_server.url, tmp_path / "drain.log", env=env).start(["--workers", "1"])
    try:
        for _ in range(2):  # the collection's settings known, so the next read is a direct one
            assert requests.get(server.url("/v1/people/ada"), timeout=10).content == SMALL
        before, reads = direct_answers(server), redis_calls(redis_server, "hmget")
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
        # The read before was a direct one (so this one was taken too), and this one read Redis once:
        # the handler answered from the direct read's document, it did not read again.
        assert before == (0, 1, 0) and redis_calls(redis_server, "hmget") == reads + 1
    finally:
        server.stop()


def _spin_redis(redis_server) -> None:
    with redis_server.client() as client:
        client.eval(SPIN, 0)
