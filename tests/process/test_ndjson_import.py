"""POST /v1/_import/{coll}: NDJSON written as it arrives, refusals by line, resumable (handlers/imports.py)."""

from __future__ import annotations

import json
import random
import socket
import time
from typing import Iterator, List, Tuple

import pytest
import requests

from tests.support import JetwayServer, feed_events, settled

MAX_BODY = 2000
BODY_TIMEOUT = 1.5
NDJSON = {"Content-Type": "application/x-ndjson"}


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    # A minimum rate a slow but steady upload here keeps to (tests/process/test_import_attacks.py has trickles).
    env = {"JETWAY_MAX_BODY": str(MAX_BODY), "JETWAY_BODY_TIMEOUT": str(BODY_TIMEOUT), "JETWAY_BODY_MIN_RATE": "10"}
    jetway = JetwayServer(redis_server.url, tmp_path_factory.mktemp("import") / "jetway.log", env=env)
    try:
        yield jetway.start(["--workers", "1"])
    finally:
        jetway.stop()


def document_lines(count: int) -> List[bytes]:
    # Varied spacing and member order: stored bytes must be the line's, not a re-serialization.
    return [b'{"id": "d%05d",  "n":%d, "s":"\\u00e9x"}' % (n, n) for n in range(1, count + 1)]


def stored(server: JetwayServer, collection: str) -> List[dict]:
    """Every document of the collection, in id order."""
    ids, cursor = [], None
    while True:
        page = requests.get(server.url(f"/v1/{collection}"), params={"limit": 1000, "cursor": cursor}).json()
        ids += page["items"]
        cursor = page["next"]
        if cursor is None:
            return ids


def test_lines_are_written_verbatim_and_bad_ones_refused_by_number(server, redis_client):
    schema = {"schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}
    assert requests.put(server.url("/v1/_collections/imp"), json=schema).status_code in (200, 201)
    lines = document_lines(3000)
    lines[9] = b'{"id": "bad", '  # malformed JSON
    lines[19] = b'["not", "an", "object"]'
    lines[29] = b'{"id": "d00030", "n": "not an integer"}'  # breaks the schema
    lines[39] = b'{"id": "d00040", "pad": "' + b"x" * MAX_BODY + b'"}'  # over the size
    lines[49] = b'{"no_id": true}'
    lines.insert(100, b"")  # a blank line: counted, not refused
    body = b"\n".join(lines) + b"\n"
    reply = requests.post(server.url("/v1/_import/imp"), params={"id": "/id"}, data=body, headers=NDJSON)
    assert reply.status_code == 200, reply.text
    report = reply.json()
    assert [(r["line"], r["status"]) for r in report["refusals"]] == [
        (10, 400),
        (20, 400),
        (30, 422),
        (40, 413),
        (50, 400),
    ]
    assert report["refusals"][4]["type"].endswith(":missing-id")
    assert (report["written"], report["created"], report["refused"], report["last_line"]) == (2995, 2995, 5, 3001)
    assert feed_events(redis_client, "imp") == 2995
    good = [line for n, line in enumerate(lines) if line.startswith(b'{"id": "d') and n not in (29, 39)]
    for line in random.Random(1).sample(good, 50):
        doc_id = json.loads(line)["id"]
        assert requests.get(server.url(f"/v1/imp/{doc_id}")).content == line
    again = requests.post(
        server.url("/v1/_import/imp"), params={"id_field": "id"}, data=b"\n".join(lines[:5]), headers=NDJSON
    )
    assert (again.json()["replaced"], again.json()["created"]) == (5, 0)


def test_lines_without_an_id_get_new_ulids(server, redis_client):
    body = b"".join(b'{"n":%d}\n' % n for n in range(250))
    report = requests.post(server.url("/v1/_import/gen"), data=body, headers=NDJSON).json()
    assert report["created"] == 250
    assert sorted(document["n"] for document in stored(server, "gen")) == list(range(250))
    ids = [key.rpartition(b":d:")[2] for key in redis_client.scan_iter("jw:{gen:*}:d:*")]
    assert len(ids) == 250 and all(len(doc_id) == 26 for doc_id in ids)  # ULIDs


def test_a_chunked_upload_is_streamed_too(server, redis_client):
    def chunks():
        for n in range(500):
            yield b'{"id":"c%d"}\n' % n

    reply = requests.post(server.url("/v1/_import/chunky"), params={"id": "/id"}, data=chunks(), headers=NDJSON)
    assert reply.json()["created"] == 500


def cut_upload(server: JetwayServer, collection: str, body: bytes, upto: int, query: str, extra: bytes = b"") -> None:
    """Send the head announcing the whole body, ``upto`` bytes of it, then close the socket."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = b"POST /v1/_import/%s?%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n" % (
        collection.encode(),
        query.encode(),
    )
    sock.sendall(head + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body[:upto])
    time.sleep(0.2)
    sock.close()


def test_an_upload_cut_at_a_random_line_resumes_with_from_line_writing_each_once(server, redis_client):
    lines = document_lines(2000)
    body = b"\n".join(lines) + b"\n"
    cut = random.Random(7).randrange(len(body) // 4, len(body) * 3 // 4)
    cut_upload(server, "cut", body, cut, "id=/id")
    written = settled(lambda: len(stored(server, "cut")))
    whole_lines = body[:cut].count(b"\n")
    assert written == whole_lines  # every line that arrived whole, and only those
    assert [document["id"] for document in stored(server, "cut")] == [f"d{n:05d}" for n in range(1, written + 1)]
    params = {"id": "/id", "from_line": written + 1}
    report = requests.post(server.url("/v1/_import/cut"), params=params, data=body, headers=NDJSON).json()
    assert (report["created"], report["skipped"]) == (2000 - written, written)
    assert feed_events(redis_client, "cut") == 2000  # each document written once
    assert len(stored(server, "cut")) == 2000


def test_a_retry_with_the_same_idempotency_key_goes_on_where_the_first_stopped(server, redis_client):
    lines = document_lines(1500)
    body = b"\n".join(lines) + b"\n"
    cut_upload(server, "key", body, len(body) // 2, "id=/id", b"Idempotency-Key: up-1\r\n")
    written = settled(lambda: feed_events(redis_client, "key"))
    assert 0 < written < 1500
    headers = {**NDJSON, "Idempotency-Key": "up-1"}
    report = requests.post(server.url("/v1/_import/key"), params={"id": "/id"}, data=body, headers=headers).json()
    assert report["created"] + report["skipped"] == 1500 and report["resumed_after"] == written
    assert feed_events(redis_client, "key") == 1500


def raw_upload(server: JetwayServer, pieces: List[Tuple[float, bytes]]) -> Tuple[int, bytes]:
    """A chunked upload sent piece by piece after each pause; the status and body of the answer."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(
        b"POST /v1/_import/slow?id=/id HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    try:
        for pause, data in pieces:
            time.sleep(pause)
            sock.sendall(b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n")
    except OSError:
        pass  # refused meanwhile: read the answer
    answer = b""
    while True:
        got = sock.recv(65536)
        if not got:
            break
        answer += got
        if b"\r\n\r\n" in answer and answer.endswith(b"}"):
            break
    sock.close()
    return int(answer.split(b" ", 2)[1]), answer.partition(b"\r\n\r\n")[2]


@pytest.mark.slow
def test_a_slow_steady_upload_goes_on_past_the_body_timeout_and_an_idle_one_gets_408(server, redis_client):
    steady = [(0.5, b'{"id":"s%d"}\n' % n) for n in range(8)] + [(0.1, b"")]  # 4 s in all, > BODY_TIMEOUT
    status, body = raw_upload(server, steady)
    assert status == 200 and json.loads(body)["created"] == 8
    status, body = raw_upload(server, [(0, b'{"id":"i1"}\n'), (BODY_TIMEOUT + 1.5, b'{"id":"i2"}\n')])
    assert status == 408
    assert requests.get(server.url("/v1/slow/i1")).status_code == 200  # what arrived whole was written


def test_an_import_holding_its_idempotency_key_makes_a_second_one_with_it_wait(server, redis_client):
    """A retry sent while the first upload still runs would write its last group twice: it gets a 409."""
    headers = {**NDJSON, "Idempotency-Key": "busy-1"}
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(
        b"POST /v1/_import/busy?id=/id HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
        b"Idempotency-Key: busy-1\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    first = b"\n".join(document_lines(150)) + b"\n"
    sock.sendall(b"%x\r\n%s\r\n" % (len(first), first))
    settled(lambda: feed_events(redis_client, "busy"))  # its first group is written: it holds the key
    second = requests.post(server.url("/v1/_import/busy"), params={"id": "/id"}, data=first, headers=headers)
    assert second.status_code == 409 and second.headers["Retry-After"] == "1"
    assert second.json()["type"].endswith(":idempotency-key-in-use")
    sock.sendall(b"0\r\n\r\n")
    answer = b""
    while not answer.endswith(b"}"):
        answer += sock.recv(65536)
    sock.close()
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["created"] == 150
    again = requests.post(server.url("/v1/_import/busy"), params={"id": "/id"}, data=first, headers=headers)
    assert again.status_code == 200 and again.json()["skipped"] == 150  # the key is free once answered
    assert feed_events(redis_client, "busy") == 150
