"""A token's first requests, many at once, leave its later ones answered on the connection.

A worker that does not know a token yet looks its record up in Redis for
each of its first requests, each with a digest of its own: the token cache
keeps the last record read. The gate keeps, by the ``Authorization``
value, the digest of the record it was given each time, so that a later
request knows the cached record by identity. This test sends a burst of a
token's first requests on many connections at once, and then checks that
its later requests are answered by the connection
(``jetway_direct_answers_total`` counts them), none left to Cyclone.
"""

from __future__ import annotations

import re
import socket
from typing import Iterator, List

import pytest
import requests

from tests.support import JetwayServer

DOCUMENT = b'{"name": "Ada", "born": 1815}'
BURST = 24
REQUESTS = 20


@pytest.fixture
def server(redis_server, tmp_path) -> Iterator[JetwayServer]:
    one = JetwayServer(redis_server.url, tmp_path / "jetway.log", auth=True)
    try:
        one.start(["--workers", "1"])
        yield one
    finally:
        one.stop()


def direct_answers(server: JetwayServer) -> float:
    """Every answer the worker made without Cyclone so far (one worker: its scrape is up to date)."""
    text = requests.get(server.url("/metrics"), timeout=10).text
    found = re.findall(r'^jetway_direct_answers_total\{kind="[^"]*"\} (\S+)$', text, re.M)
    return sum(float(count) for count in found)


def burst(server: JetwayServer, request: bytes) -> List[bytes]:
    """``request`` sent on ``BURST`` connections before any is read; each one's first response line."""
    host, port = server.url("/").split("//")[1].split("/")[0].split(":")
    connections = [socket.create_connection((host, int(port)), timeout=10) for _ in range(BURST)]
    try:
        for connection in connections:
            connection.sendall(request)
        return [_first_line(connection) for connection in connections]
    finally:
        for connection in connections:
            connection.close()


def _first_line(connection: socket.socket) -> bytes:
    with connection.makefile("rb") as reader:
        return reader.readline()


def test_a_tokens_first_requests_at_once_leave_the_next_ones_to_the_direct_way(server):
    token = server.make_token("writer", "admin")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    assert requests.put(server.url("/v1/people/ada"), data=DOCUMENT, headers=headers, timeout=10).ok
    # A new token, many requests at once: none of them knows it yet.
    fresh = server.make_token("burst", "admin")
    request = f"GET /v1/people/ada HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {fresh}\r\n\r\n".encode()
    assert burst(server, request) == [b"HTTP/1.1 200 OK\r\n"] * BURST

    headers = {"Authorization": f"Bearer {fresh}", "Content-Type": "application/json"}
    before = direct_answers(server)
    for _ in range(REQUESTS):
        assert requests.put(server.url("/v1/people/ada"), data=DOCUMENT, headers=headers, timeout=10).ok
        read = requests.get(server.url("/v1/people/ada"), headers=headers, timeout=10)
        assert read.status_code == 200 and read.content == DOCUMENT
    assert direct_answers(server) - before >= 2 * REQUESTS - 1, "the token's requests went through Cyclone"
