"""Hostile clients against a real server: memory and CPU stay bounded whatever they do.

A client that pipelines and never reads, one that reads large responses
slowly, one that stops reading altogether, and many that send part of a
body and wait. ``python -m loadtest.studies._hostile`` measures the same attacks at
full size; docs/operations.md, "Hostile clients", has its figures.
"""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Iterator, List

import pytest
import requests

from loadtest.studies._attacks import (
    answered,
    children,
    connect,
    cpu_share,
    get_request,
    partial_body,
    pipeline_without_reading,
    rss_mb,
)
from tests.proc_sockets import established_inodes
from tests.support import JetwayServer, wait_until

MIB = 1024 * 1024
BIG = b'{"pad":"' + b"x" * (200 * 1024) + b'"}'
SEND_TIMEOUT = 1.0
BUDGET_BODIES = 4


@pytest.fixture(scope="module")
def defaults(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    """One worker with the production limits."""
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("hostile") / "defaults.log")
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


@pytest.fixture(scope="module")
def strict(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    """One worker with a 1 s send timeout and room for four 1 MiB bodies."""
    env = {
        "JETWAY_SEND_TIMEOUT": str(SEND_TIMEOUT),
        "JETWAY_MAX_BODY": str(MIB),
        "JETWAY_BODY_BUDGET": str(BUDGET_BODIES * MIB),
    }
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("hostile") / "strict.log", env=env)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


def put(server: JetwayServer, path: str, body: bytes) -> int:
    headers = {"Content-Type": "application/json"}
    return requests.put(server.url(path), data=body, headers=headers, timeout=10).status_code


def one_mib_document() -> bytes:
    return b'{"pad":"' + b"y" * (MIB - 10) + b'"}'


def test_a_client_pipelining_without_reading_costs_a_worker_little_memory_and_no_cpu_after(defaults, redis_client):
    """5 s of pipelined GETs of a 200 KB document, never read: the worker grows by at most 50 MB, idle 2 s after."""
    assert put(defaults, "/v1/hostile/big", BIG) == 201
    worker = children(defaults.process.pid)[0]
    # What the worker spends idle (the hot cache's heartbeat, its timers): the attack must leave no more.
    idle = cpu_share([worker], 1.0)
    before = rss_mb(worker)
    sock = pipeline_without_reading(defaults.port, get_request("/v1/hostile/big"), 5.0)
    grown = rss_mb(worker) - before
    sock.close()
    time.sleep(2.0)
    share = cpu_share([worker], 1.0)
    print(
        f"\npipelining without reading for 5 s: worker +{grown:.1f} MB; 2 s after close: {share:.1%} of a core"
        f" ({idle:.1%} idle before)"
    )
    assert grown <= 50
    assert share < idle + 0.05
    assert requests.get(defaults.url("/healthz"), timeout=5).status_code == 200


def test_a_slow_reader_gets_every_response_in_order(strict, redis_client):
    """40 pipelined 200 KB responses read at ~2 MB/s, longer than the send timeout: all arrive, none cut."""
    assert put(strict, "/v1/hostile/big", BIG) == 201
    sock = connect(strict.port, receive_buffer=16 * 1024)
    sock.setblocking(True)
    sock.sendall(get_request("/v1/hostile/big") * 40)
    received = bytearray()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        chunk = sock.recv(32 * 1024)
        if not chunk:
            break
        received += chunk
        if len(received) > 40 * len(BIG) and received.endswith(b'"}') and received.count(BIG) == 40:
            break
        time.sleep(0.015)
    sock.close()
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 40
    assert received.count(BIG) == 40


def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(strict, redis_client):
    assert put(strict, "/v1/hostile/big", BIG) == 201
    sock = pipeline_without_reading(strict.port, get_request("/v1/hostile/big"), 0.5)
    client_port = sock.getsockname()[1]
    try:
        assert established_inodes(strict.port, client_port)
        wait_until(lambda: not established_inodes(strict.port, client_port), SEND_TIMEOUT + 3, "the connection aborted")
    finally:
        sock.close()


def test_bodies_beyond_the_budget_are_refused_with_503_while_reads_go_on(strict, redis_client):
    assert put(strict, "/v1/hostile/small", b'{"a":1}') == 201
    held = [partial_body(strict.port, f"/v1/hostile/b{n}", MIB, 64 * 1024) for n in range(10)]
    try:
        time.sleep(0.5)
        answers = [answered(sock, 0.3) for sock in held]
        refused = [answer for answer in answers if answer.startswith(b"HTTP/1.1 503")]
        assert len(refused) == 10 - BUDGET_BODIES and answers.count(b"") == BUDGET_BODIES, answers
        head, _, body = refused[0].partition(b"\r\n\r\n")
        assert b"\r\nRetry-After: 1\r\n" in head
        assert json.loads(body)["type"] == "urn:jetway:problem:server-busy"
        # A request without a body needs no budget.
        assert requests.get(strict.url("/v1/hostile/small"), timeout=5).json() == {"a": 1}
        assert put(strict, "/v1/hostile/more", b'{"a":2}') == 503
    finally:
        close_all(held)
    # Bodies lost with their connections gave their bytes back.
    wait_until(lambda: put(strict, "/v1/hostile/more", b'{"a":2}') == 201, 5, "the budget back")


def test_finished_bodies_give_their_budget_back(strict, redis_client):
    document = one_mib_document()
    statuses = [put(strict, f"/v1/hostile/full{n}", document) for n in range(3 * BUDGET_BODIES)]
    assert statuses == [201] * (3 * BUDGET_BODIES)


def test_a_chunked_body_reserves_what_its_chunks_announce(strict, redis_client):
    """With 3.5 MiB of a 4 MiB budget held: a chunk of 256 KiB fits, a second of 300 KiB does not."""
    held = [partial_body(strict.port, f"/v1/hostile/b{n}", MIB, 1024) for n in range(BUDGET_BODIES - 1)]
    held.append(partial_body(strict.port, "/v1/hostile/half", MIB // 2, 1024))
    sock = connect(strict.port)
    try:
        time.sleep(0.3)
        sock.setblocking(True)
        sock.sendall(
            b"PUT /v1/hostile/chunked HTTP/1.1\r\nHost: jetway\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % (MIB // 4) + b" " * (MIB // 4) + b"\r\n"
        )
        assert answered(sock, 0.5) == b""
        sock.sendall(b"%x\r\n" % (300 * 1024) + b" " * 16)
        assert answered(sock, 2.0).startswith(b"HTTP/1.1 503")
    finally:
        close_all([*held, sock])


def close_all(sockets: List[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def test_pipelined_requests_are_answered_in_order_without_reading_ahead(defaults, redis_client):
    """100 pipelined small GETs in one send: 100 answers, in order."""
    for n in range(100):
        assert put(defaults, f"/v1/hostile/d{n}", b'{"n":%d}' % n) == 201
    with socket.create_connection(("127.0.0.1", defaults.port), timeout=10) as sock:
        sock.sendall(b"".join(get_request(f"/v1/hostile/d{n}") for n in range(100)))
        received = b""
        while received.count(b'{"n":') < 100 and select.select([sock], [], [], 10)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    bodies = [int(part.split(b"}")[0]) for part in received.split(b'{"n":')[1:]]
    assert bodies == list(range(100))
