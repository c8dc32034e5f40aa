"""Imports turned against the server, and cut short by every cause (handlers/imports.py, api/streamed_body.py).

Each import under an ``Idempotency-Key`` that ends early must say what it
wrote, and a resume with the key must leave every line written exactly
once (one document, one feed event) whatever the cause and the point.
A trickling body must end by its minimum rate, and slow imports must not
take the body budget from other clients' writes.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import requests

from tests.support import JetwayServer, feed_events, settled

MAX_BODY = 100_000
# One streamed body's reservation is 2 x 64 KiB + MAX_BODY; streams get a quarter of the budget, room for two.
# Without that share, eight would fit, and leave room for one 90 KB PUT at a time.
BODY_BUDGET = 2_000_000
BODY_TIMEOUT = 1.5
MIN_RATE = 200
LINES = 350
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {
        "JETWAY_MAX_BODY": str(MAX_BODY),
        "JETWAY_BODY_BUDGET": str(BODY_BUDGET),
        "JETWAY_BODY_TIMEOUT": str(BODY_TIMEOUT),
        "JETWAY_BODY_MIN_RATE": str(MIN_RATE),
    }
    jetway = JetwayServer(redis_server.url, tmp_path_factory.mktemp("attacks") / "jetway.log", env=env)
    try:
        yield jetway.start(["--workers", "1"])
    finally:
        jetway.stop()


def lines_of(count: int, start: int = 1) -> List[bytes]:
    return [b'{"n":%d,"pad":"%s"}' % (n, b"p" * (n % 40)) for n in range(start, start + count)]


class Upload:
    """A chunked import on a raw socket: sent piece by piece, answered (or not) at the end."""

    def __init__(self, server: JetwayServer, collection: str, key: Optional[str], query: str = "") -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=15)
        head = b"POST /v1/_import/%s%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n" % (
            collection.encode(),
            (b"?" + query.encode()) if query else b"",
        )
        if key is not None:
            head += b"Idempotency-Key: %s\r\n" % key.encode()
        self.sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")

    def chunk(self, data: bytes) -> bool:
        """Send one chunk; False once the server has closed its side."""
        try:
            self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
            return True
        except OSError:
            return False

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def end(self) -> None:
        self.sock.sendall(b"0\r\n\r\n")

    def answer(self) -> Tuple[int, Dict[str, object]]:
        """The status and JSON body of the answer."""
        data = b""
        while b"\r\n\r\n" not in data:
            got = self.sock.recv(65536)
            if not got:
                raise AssertionError(f"closed without an answer: {data!r}")
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        while len(body) < length:
            body += self.sock.recv(65536)
        self.sock.close()
        return int(head.split(b" ", 2)[1]), json.loads(body)

    def close(self) -> None:
        self.sock.close()


def documents(server: JetwayServer, collection: str) -> List[dict]:
    found, cursor = [], None
    while True:
        page = requests.get(server.url(f"/v1/{collection}"), params={"limit": 1000, "cursor": cursor}).json()
        found += page["items"]
        cursor = page["next"]
        if cursor is None:
            return found


def resume(server: JetwayServer, collection: str, key: str, body: bytes) -> dict:
    """The whole body again under the key, as ``python -m api import --resume`` sends it (retrying a 409)."""
    headers = {"Content-Type": "application/x-ndjson", "Idempotency-Key": key}
    for _ in range(60):
        reply = requests.post(server.url(f"/v1/_import/{collection}"), data=body, headers=headers)
        if reply.status_code != 409:
            break
        time.sleep(0.5)
    assert reply.status_code == 200, reply.text
    return reply.json()


def assert_each_line_once(server: JetwayServer, redis_client, collection: str) -> None:
    stored = documents(server, collection)
    assert sorted(document["n"] for document in stored) == list(range(1, LINES + 1))
    assert feed_events(redis_client, collection) == LINES  # each line's write logged once


def cut(server: JetwayServer, redis_client, collection: str, key: str, cause: str, at: int) -> Optional[dict]:
    """Send lines 1..at (in pieces), then end the upload by ``cause``; the answer's report, if any."""
    body = b"".join(line + b"\n" for line in lines_of(LINES))
    upload = Upload(server, collection, key)
    end = sum(len(line) + 1 for line in lines_of(at))
    pieces = random.Random(at).sample(range(1, end), min(5, end - 1)) if end > 1 else []
    start = 0
    for stop in [*sorted(pieces), end]:
        upload.chunk(body[start:stop])
        start = stop
    if cause == "malformed-chunk":
        upload.raw(b"zz\r\n")
    elif cause == "client-gone":
        settled(lambda: feed_events(redis_client, collection))
        upload.close()
        return None
    elif cause == "redis-error":
        settled(lambda: feed_events(redis_client, collection))
        redis_client.config_set("maxmemory", "1")
        try:
            upload.chunk(body[end:])  # the rest: its writes fail
            upload.end()
            return check_cut(upload.answer(), 500)
        finally:
            redis_client.config_set("maxmemory", "0")
    expected = {"malformed-chunk": 400, "body-timeout": 408}[cause]
    return check_cut(upload.answer(), expected)


def check_cut(answer: Tuple[int, Dict[str, object]], at_least: int) -> dict:
    status, report = answer
    assert status >= at_least and status != 500, report  # never a bug's 500
    assert report["complete"] is False and report["resume_from_line"] == report["last_line"] + 1
    return report


@pytest.mark.parametrize("cause", ["malformed-chunk", "body-timeout", "client-gone", "redis-error"])
def test_an_import_cut_short_at_random_points_by_each_cause_resumes_writing_each_line_once(server, redis_client, cause):
    for trial, at in enumerate(random.Random(cause).sample(range(1, LINES), 3)):
        collection = f"cut-{cause}-{trial}"
        key = f"k-{cause}-{trial}"
        report = cut(server, redis_client, collection, key, cause, at)
        if report is not None:
            # The answer says exactly what is stored: every line it names, and none after.
            assert report["written"] == len(documents(server, collection)) == feed_events(redis_client, collection)
            if cause != "redis-error":  # there, the rest was sent too, and Redis may take a group of it
                assert report["last_line"] <= at
        body = b"".join(line + b"\n" for line in lines_of(LINES))
        final = resume(server, collection, key, body)
        assert final["complete"] is True
        assert_each_line_once(server, redis_client, collection)


@pytest.mark.slow
def test_a_trickling_body_ends_by_its_minimum_rate_and_says_what_it_wrote(server, redis_client):
    """Never idle (a byte every 0.25 s), yet far below the minimum rate: a 408 with the lines written."""
    upload = Upload(server, "trickle", "trickle-1")
    upload.chunk(b"".join(line + b"\n" for line in lines_of(150)))
    started = time.monotonic()
    while time.monotonic() - started < 20 and upload.chunk(b" "):
        time.sleep(0.25)
    status, report = upload.answer()
    assert status == 408
    assert (report["written"], report["last_line"], report["resume_from_line"]) == (150, 150, 151)
    body = b"".join(line + b"\n" for line in lines_of(LINES))
    assert resume(server, "trickle", "trickle-1", body)["skipped"] == 150
    assert_each_line_once(server, redis_client, "trickle")


def test_slow_imports_cannot_take_the_body_budget_from_other_writes(server, redis_client):
    """Six imports trickling at once: those past the streams' share get 503, and six 90 KB PUTs all go through."""
    uploads = [Upload(server, "hog", None) for _ in range(6)]
    refused = 0
    for upload in uploads:
        upload.chunk(b'{"n":1}\n')
    time.sleep(0.3)
    statuses = []
    for upload in uploads:
        upload.sock.settimeout(0.2)
        try:
            statuses.append(upload.answer()[0])
        except (socket.timeout, AssertionError):
            statuses.append(None)  # still running
    refused = statuses.count(503)
    assert refused >= 4, statuses  # the streams' share holds two
    big = b'{"pad":"' + b"x" * 90_000 + b'"}'
    results: List[int] = []

    def put(n: int) -> None:
        results.append(requests.put(server.url(f"/v1/hogged/d{n}"), data=big, headers=JSON).status_code)

    threads = [threading.Thread(target=put, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [201] * 6
    for upload in uploads:
        upload.close()


def test_an_id_pointer_with_a_digit_that_is_not_ascii_refuses_the_line_not_the_server(server):
    body = b'{"a":["x","y","z"]}\n{"a":["u","v"]}\n'
    reply = requests.post(
        server.url("/v1/_import/digits"),
        params={"id": "/a/\u00b2"},
        data=body,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert reply.status_code == 200, reply.text
    assert [(r["line"], r["status"]) for r in reply.json()["refusals"]] == [(1, 400), (2, 400)]
    ascii_digit = requests.post(
        server.url("/v1/_import/digits"),
        params={"id": "/a/1"},
        data=body,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert ascii_digit.json()["created"] == 2


@pytest.mark.slow
def test_an_import_that_lives_past_its_lease_keeps_its_key_and_a_second_one_waits(server, redis_client):
    """No group is recorded for 18 s (one long line trickles in at the minimum rate): the lease is still renewed."""
    upload = Upload(server, "lease", "lease-1")
    upload.chunk(b"".join(line + b"\n" for line in lines_of(150)))
    settled(lambda: feed_events(redis_client, "lease"))
    upload.chunk(b'{"n":151,"pad":"')
    started = time.monotonic()
    body = b"".join(line + b"\n" for line in lines_of(LINES))
    headers = {"Content-Type": "application/x-ndjson", "Idempotency-Key": "lease-1"}
    while time.monotonic() - started < 18:
        assert upload.chunk(b"q" * (MIN_RATE // 2))
        time.sleep(0.4)
    second = requests.post(server.url("/v1/_import/lease"), data=body, headers=headers)
    assert second.status_code == 409, second.text
    upload.chunk(b'"}\n' + b"".join(line + b"\n" for line in lines_of(LINES - 151, 152)))
    upload.end()
    status, report = upload.answer()
    assert status == 200 and report["written"] == LINES
    again = requests.post(server.url("/v1/_import/lease"), data=body, headers=headers)
    assert again.status_code == 200 and again.json()["skipped"] == LINES
    assert feed_events(redis_client, "lease") == LINES
