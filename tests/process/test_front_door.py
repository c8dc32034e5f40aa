"""The hardened front door: raw bytes over a socket to the real server.

Each hole found in Cyclone's connection has a test here that sends the bytes
and checks the answer, and that the next request on the connection (if any)
is not confused.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from api.client_address import client_address
from tests.support import JetwayServer, worker_pids

MAX_BODY = 1000
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
KEEPALIVE_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def front(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {
        "JETWAY_MAX_BODY": str(MAX_BODY),
        "JETWAY_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
        "JETWAY_BODY_TIMEOUT": str(BODY_TIMEOUT),
        "JETWAY_KEEPALIVE_TIMEOUT": str(KEEPALIVE_TIMEOUT),
        "JETWAY_TRUSTED_PROXIES": "127.0.0.0/8",
        "JETWAY_ACCESS_LOG": "on",
    }
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("front") / "front.log", env=env)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


class Conn:
    """A raw client connection that reads whole responses."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> Tuple[int, Dict[str, str], bytes]:
        status_line = self.file.readline()
        if not status_line:
            raise ConnectionError("closed before a response")
        status = int(status_line.split()[1])
        headers: Dict[str, str] = {}
        for line in iter(self.file.readline, b"\r\n"):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = self.file.read(int(headers.get("content-length", "0")))
        return status, headers, body

    def closed_by_server(self, within: float = 5.0) -> bool:
        self.sock.settimeout(within)
        try:
            return self.file.read(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def conn(front, redis_client) -> Iterator[Conn]:
    connection = Conn(front.port)
    yield connection
    connection.close()


def request(method: str, path: str, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def put(path: str, body: bytes) -> bytes:
    return request("PUT", path, body, {"Content-Type": "application/json"})


def test_content_length_with_transfer_encoding_is_refused_and_closed(conn):
    conn.send(
        b"PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n7\r\n{"a":1}\r\n0\r\n\r\n'
    )
    status, headers, _ = conn.response()
    assert (status, headers["content-type"], headers["connection"]) == (400, "application/problem+json", "close")
    assert conn.closed_by_server()


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "+5", "7, 8"])
def test_a_bad_content_length_is_refused_and_closed(conn, value):
    conn.send(f"PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nContent-Length: {value}\r\n\r\n{{}}".encode())
    assert conn.response()[0] == 400
    assert conn.closed_by_server()


def test_repeated_different_content_lengths_are_refused(conn):
    conn.send(b'PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nContent-Length: 7\r\nContent-Length: 8\r\n\r\n{"a":1}')
    assert conn.response()[0] == 400
    assert conn.closed_by_server()


def test_repeated_equal_content_lengths_are_one(conn):
    conn.send(
        b"PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
        b'Content-Length: 7\r\n\r\n{"a":1}' + request("GET", "/v1/c/a")
    )
    assert conn.response()[0] == 201
    assert conn.response()[2] == b'{"a":1}'


def test_a_chunked_body_is_decoded_and_the_next_request_is_not_confused(conn):
    smuggled = b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
    body = b'{"s":"' + smuggled.replace(b"\r\n", b" ") + b'"}'
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:5], body[5:]))
    conn.send(
        b"PUT /v1/c/chunky HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-Trailer: 1\r\n\r\n" + request("GET", "/v1/c/chunky")
    )
    assert conn.response()[0] == 201
    status, _, got = conn.response()
    assert (status, got) == (200, body)


def test_a_chunked_body_over_the_limit_is_413(conn):
    conn.send(b"PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % (MAX_BODY + 1))
    conn.send(b"x" * (MAX_BODY + 1))
    assert conn.response()[0] == 413
    assert conn.closed_by_server()


def test_a_body_over_the_limit_is_413_before_it_is_sent(conn):
    conn.send(b"PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000000\r\n\r\n")
    status, _, body = conn.response()  # answered without a byte of the body
    assert status == 413 and b"body-too-large" in body
    assert conn.closed_by_server()


def test_more_than_100_header_lines_is_431(conn):
    headers = "".join(f"X-H{n}: v\r\n" for n in range(101))
    conn.send(f"GET /healthz HTTP/1.1\r\n{headers}\r\n".encode())
    assert conn.response()[0] == 431


def test_more_than_64_kib_of_headers_is_431(conn):
    conn.send(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    assert conn.response()[0] == 431


def test_100_header_lines_are_fine(conn):
    headers = "".join(f"X-H{n}: v\r\n" for n in range(99))
    conn.send(f"GET /healthz HTTP/1.1\r\nHost: t\r\n{headers}\r\n".encode())
    assert conn.response()[0] == 200


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nNoColon\r\n\r\n",
        b"GET  /healthz HTTP/1.1\r\n\r\n",
    ],
)
def test_malformed_heads_are_400(conn, head):
    conn.send(head)
    assert conn.response()[0] == 400
    assert conn.closed_by_server()


def test_header_timeout_counts_from_the_first_byte_despite_trickling(conn):
    started = time.monotonic()
    conn.send(b"GET /healthz HTTP/1.1\r\n")
    while not select.select([conn.sock], [], [], 0.5)[0]:
        assert time.monotonic() - started < HEADER_TIMEOUT + 2, "the trickle kept the connection open"
        conn.send(b"X")  # a byte now and then must not reset the clock
    assert conn.response()[0] == 408
    assert HEADER_TIMEOUT - 0.5 < time.monotonic() - started < HEADER_TIMEOUT + 1.5
    assert conn.closed_by_server()


def test_body_timeout_closes_the_connection(conn):
    conn.send(b"PUT /v1/c/a HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n{}")
    started = time.monotonic()
    assert conn.response()[0] == 408
    assert BODY_TIMEOUT - 0.5 < time.monotonic() - started < BODY_TIMEOUT + 1.5
    assert conn.closed_by_server()


def test_an_idle_keep_alive_connection_is_closed(conn):
    conn.send(request("GET", "/healthz"))
    assert conn.response()[0] == 200
    started = time.monotonic()
    assert conn.closed_by_server(within=KEEPALIVE_TIMEOUT + 2)
    assert time.monotonic() - started > KEEPALIVE_TIMEOUT - 0.5


def test_pipelined_requests_are_answered_in_order(conn):
    """The first handler waits on Redis; its response must not be lost."""
    conn.send(put("/v1/c/p1", b'{"n":1}') + put("/v1/c/p2", b'{"n":2}'))
    assert [conn.response()[0] for _ in range(2)] == [201, 201]
    batch = b"".join(request("GET", f"/v1/c/p{1 + n % 2}") + request("GET", "/healthz") for n in range(50))
    conn.send(batch)
    bodies = [conn.response()[2] for _ in range(100)]
    expected = [b'{"n":%d}' % (1 + n % 2) if i == 0 else b'{"status":"ok"}' for n in range(50) for i in range(2)]
    assert bodies == expected


def test_blank_lines_before_a_request_are_ignored_and_a_repeated_head_is_read_again(conn):
    """RFC 9112 2.2, whether the blank lines come in the same read as the head or in one of their own; and a
    head sent again on the connection (parsed once, then remembered) answers as the first did."""
    for blank in (b"\r\n", b"\r\n\r\n"):
        conn.send(blank + request("GET", "/healthz"))
        assert conn.response()[:1] == (200,)
    conn.send(b"\r\n")
    time.sleep(0.2)
    conn.send(request("GET", "/healthz"))
    assert conn.response()[:1] == (200,)
    for _ in range(3):
        conn.send(put("/v1/c/again", b'{"n":3}'))
        assert conn.response()[0] in (200, 201)
        conn.send(request("GET", "/v1/c/again"))
        assert conn.response()[::2] == (200, b'{"n":3}')


def test_large_pipelined_responses_arrive_whole_and_in_order(api):
    """Some bodies are larger than the socket's buffers: what the kernel does not take at once waits its turn."""
    expected = {"/healthz": b'{"status":"ok"}', "/v1/c/small": b'{"n":0}'}
    for n, size in enumerate((9_000, 60_000, 300_000)):
        expected[f"/v1/c/big{n}"] = b'{"text":"%s"}' % (b"%d" % n * size)
    for path, body in expected.items():
        if path != "/healthz":
            assert api.put_json(path, body).status_code == 201
    paths = ["/v1/c/big0", "/v1/c/small", "/v1/c/big1", "/healthz", "/v1/c/big2"] * 4
    conn = Conn(api.server.port)
    try:
        conn.send(
            b"".join(
                request(method, path, headers=api.auth_header)
                for method, path in [*(("GET", path) for path in paths), ("HEAD", "/v1/c/big1")]
            )
        )
        for path in paths:
            status, headers, body = conn.response()
            assert (status, body) == (200, expected[path])
            assert int(headers["content-length"]) == len(body)
        head = b"".join(iter(conn.file.readline, b"\r\n"))  # a HEAD's answer: the head alone
    finally:
        conn.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"Content-Length: %d\r\n" % len(expected["/v1/c/big1"]) in head


@pytest.mark.parametrize("value", ["close", "CLOSE", "Close", "keep-alive, Close"])
def test_connection_close_is_matched_case_insensitively(conn, value):
    conn.send(request("GET", "/healthz", headers={"Connection": value}))
    status, headers, _ = conn.response()
    assert status == 200 and headers["connection"] == "close"
    assert conn.closed_by_server()


def test_http_1_0_keeps_the_connection_only_when_asked(front):
    kept = Conn(front.port)
    try:
        kept.send(b"GET /healthz HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        status, headers, _ = kept.response()
        assert (status, headers["connection"]) == (200, "keep-alive")
        kept.send(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert kept.response()[0] == 200
        assert kept.closed_by_server()
    finally:
        kept.close()


def _logged_client(front: JetwayServer, marker: str) -> str:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in front.log_path.read_text().splitlines():
            if marker in line and line.startswith("{"):
                return json.loads(line)["client"]
        time.sleep(0.05)
    raise AssertionError(f"{marker} not logged")


def test_x_forwarded_for_from_a_trusted_peer_gives_the_rightmost_untrusted_hop(conn, front):
    conn.send(request("GET", "/healthz?xff-1", headers={"X-Forwarded-For": "6.6.6.6, 203.0.113.9, 127.0.0.2"}))
    assert conn.response()[0] == 200
    assert _logged_client(front, "xff-1") == "203.0.113.9"


@pytest.mark.parametrize(
    ("peer", "hops", "expected"),
    [
        ("198.51.100.1", ["6.6.6.6"], "198.51.100.1"),  # untrusted peer: its own address
        ("10.0.0.1", ["6.6.6.6, 203.0.113.9"], "203.0.113.9"),
        ("10.0.0.1", ["203.0.113.9", "10.0.0.7"], "203.0.113.9"),  # two header lines, a trusted hop
        ("10.0.0.1", ["10.0.0.3, 10.0.0.2"], "10.0.0.3"),  # all trusted: the left-most
        ("10.0.0.1", ["evil, 10.0.0.2"], "10.0.0.2"),  # garbage beyond the trusted hops
        ("::ffff:10.0.0.1", ["203.0.113.9"], "203.0.113.9"),  # IPv4 peer on a dual-stack socket
    ],
)
def test_client_address(peer, hops, expected):
    import ipaddress

    assert client_address(peer, hops, (ipaddress.ip_network("10.0.0.0/8"),)) == expected


def test_without_trusted_proxies_x_forwarded_for_is_ignored():
    assert client_address("127.0.0.1", ["6.6.6.6"], ()) == "127.0.0.1"


def _ended(sock: socket.socket) -> bool:
    """The server answered (a 408) or closed; a live silent socket would block."""
    try:
        sock.recv(65536)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _cpu_wait(schedstat: str) -> float:
    """Seconds the thread waited for a CPU while runnable (its /proc schedstat's second figure)."""
    return int(Path(schedstat).read_text().split()[1]) / 1e9


def test_slowloris_does_not_starve_ordinary_clients(front, redis_client):
    """500 connections trickling a header byte per second; others still get answers within a second
    of the server's own time (less what the worker and this client waited for a CPU), and the
    header timeout ends the trickling connections though their bytes keep coming."""
    slow: List[socket.socket] = []
    try:
        for _ in range(500):
            sock = socket.create_connection(("127.0.0.1", front.port))
            sock.setblocking(False)
            sock.send(b"GET /healthz HTTP/1.1\r\n")
            slow.append(sock)
        stop = threading.Event()

        def trickle() -> None:
            while not stop.wait(1.0):
                for sock in slow:
                    with contextlib.suppress(OSError):  # already closed by the server
                        sock.send(b"X")

        trickler = threading.Thread(target=trickle)
        trickler.start()
        # On a loaded 2-core machine the worker waited up to 5.5 s for a CPU during one request (the
        # commit that added this has the figures): that is the machine, not the attack. A worker the
        # attack starves is busy or not accepting, which is no CPU wait, so that stays counted.
        worker = f"/proc/{worker_pids(front)[0]}/schedstat"
        client = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        try:
            worst, worst_raw = 0.0, 0.0
            deadline = time.monotonic() + HEADER_TIMEOUT + 1
            while time.monotonic() < deadline:
                waits = _cpu_wait(worker) + _cpu_wait(client)
                started = time.monotonic()
                conn = Conn(front.port, timeout=30)  # a raw wait of 5 s was the machine, as above
                conn.send(request("GET", "/healthz"))
                assert conn.response()[0] == 200
                conn.close()
                took = time.monotonic() - started
                worst = max(worst, took - (_cpu_wait(worker) + _cpu_wait(client) - waits))
                worst_raw = max(worst_raw, took)
                time.sleep(0.1)
            assert worst < 1.0, f"an ordinary request took {worst:.2f}s less its CPU waits (longest: {worst_raw:.2f}s)"
            # Still trickling: a clock that each byte reset would never end them. Waited for, not
            # timed: how soon the worker gets to them after their timeout is the machine's load.
            ended: Set[int] = set()
            waited_until = time.monotonic() + 30
            while len(ended) < 495 and time.monotonic() < waited_until:
                ended.update(n for n, sock in enumerate(slow) if n not in ended and _ended(sock))
                time.sleep(0.2)
        finally:
            stop.set()
            trickler.join()
        assert len(ended) >= 495, f"only {len(ended)} of 500 slowloris connections were ended by the header timeout"
    finally:
        for sock in slow:
            sock.close()
