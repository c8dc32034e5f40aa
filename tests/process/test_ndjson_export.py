"""GET /v1/{coll} as NDJSON: every document verbatim in id order, streamed a page at a time (handlers/exports.py)."""

from __future__ import annotations

import base64
import random
import socket
import time
from hashlib import sha256
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest
import redis
import requests

from cache import keys
from tests.support import JetwayServer, worker_pids

SEND_TIMEOUT = 4.0
NDJSON = "application/x-ndjson"


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {"JETWAY_SEND_TIMEOUT": str(SEND_TIMEOUT)}
    jetway = JetwayServer(redis_server.url, tmp_path_factory.mktemp("export") / "jetway.log", env=env, auth=True)
    try:
        yield jetway.start(["--workers", "1"])
    finally:
        jetway.stop()


@pytest.fixture(scope="module")
def redis_stats(redis_server) -> Iterator[redis.Redis]:
    """Redis, flushed once for the module (not per test: the module's tokens live in it)."""
    client = redis_server.client()
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def tokens(server, redis_stats) -> Dict[str, Dict[str, str]]:
    made = {"full": server.make_token("full", "read:*", "write:*"), "writer": server.make_token("w", "write:*")}
    return {name: {"Authorization": "Bearer " + token} for name, token in made.items()}


def documents(count: int, pad: int = 0) -> Dict[bytes, bytes]:
    """Stored bytes by id: varied spacing and member order, none holding its id (not re-serialized anywhere)."""
    rng = random.Random(count)
    made = {}
    for n, key in enumerate(rng.sample(range(10**6), count)):
        spaces = b" " * rng.randrange(3)
        made[b"k%06d" % key] = b'{"n":%s%d, "s":"\\u00e9\\n", "p":"%s"}' % (spaces, n, b"x" * pad)
    return made


def load(server: JetwayServer, headers, collection: str, docs: Dict[bytes, bytes]) -> None:
    """Through the import, in the export's own with_ids form (shuffled: the export sorts)."""
    lines = [b'{"id":"%s","doc":%s}\n' % (doc_id, body) for doc_id, body in docs.items()]
    random.Random(1).shuffle(lines)
    reply = requests.post(
        server.url(f"/v1/_import/{collection}"),
        params={"with_ids": "1"},
        data=b"".join(lines),
        headers={**headers, "Content-Type": NDJSON},
    )
    assert reply.status_code == 200 and reply.json()["written"] == len(docs), reply.text


def export(server: JetwayServer, headers, collection: str, **params: str) -> requests.Response:
    return requests.get(server.url(f"/v1/{collection}"), params=params, headers={**headers, "Accept": NDJSON})


def cursor_after(doc_id: bytes) -> str:
    return base64.urlsafe_b64encode(doc_id).rstrip(b"=").decode()


def test_every_document_verbatim_in_id_order_in_chunks_and_resumable_from_a_cursor(server, tokens, redis_stats):
    docs = documents(2500)  # more than one page (handlers.exports.PAGE_DOCUMENTS)
    load(server, tokens["full"], "exp", docs)
    ordered = sorted(docs)
    reply = export(server, tokens["full"], "exp")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"] == NDJSON and reply.headers["Transfer-Encoding"] == "chunked"
    assert reply.headers["X-Jetway-Documents"] == "2500"
    assert reply.content == b"".join(docs[doc_id] + b"\n" for doc_id in ordered)
    with_ids = export(server, tokens["full"], "exp", with_ids="1").content.splitlines()
    assert with_ids == [b'{"id":"%s","doc":%s}' % (doc_id, docs[doc_id]) for doc_id in ordered]
    resumed = export(server, tokens["full"], "exp", cursor=cursor_after(ordered[1233]))
    assert resumed.content == b"".join(docs[doc_id] + b"\n" for doc_id in ordered[1234:])
    assert export(server, tokens["full"], "empty").content == b""


def test_pages_of_large_documents_ask_for_the_ids_their_bytes_hold_not_a_thousand(server, tokens, redis_stats):
    """A 1 MiB page holds ~125 documents of 8 KB: asking 1,000 ids a page made Redis measure (HSTRLEN) the
    ~875 the page had no room for, page after page (handlers.exports, _page_documents)."""
    docs = documents(2000, pad=8000)  # ~16 MB: ~16 pages of 1 MiB (handlers.exports.PAGE_BYTES)
    load(server, tokens["full"], "large", docs)
    measured_before, read_before = commands_called(redis_stats, "hstrlen"), commands_called(redis_stats, "hget")
    reply = export(server, tokens["full"], "large")
    assert reply.status_code == 200
    expected = b"".join(docs[doc_id] + b"\n" for doc_id in sorted(docs))
    assert (len(reply.content), sha256(reply.content).hexdigest()) == (len(expected), sha256(expected).hexdigest())
    measured = commands_called(redis_stats, "hstrlen") - measured_before
    assert commands_called(redis_stats, "hget") - read_before >= len(docs)
    # The first page asks for 1,000 ids (nothing is known of the sizes yet) and measures the ~875 it has no room
    # for; the others ask for what their bytes hold. 1,000 ids a page measured ~9,900 here.
    assert measured < len(docs), measured


def test_writes_racing_an_export_lose_no_document_that_lived_through_it_and_repeat_none(server, tokens, redis_stats):
    """The scan reads ids a page ahead (cache/documents/scan.py): ids deleted before their page, and ids created
    behind or ahead of it, while a slow client reads."""
    docs = documents(3000, pad=2000)  # ~6 MB: more than the socket buffers hold, so the client sets the pace
    load(server, tokens["full"], "racing", docs)
    doomed = random.Random(7).sample(sorted(docs), 400)
    born = [b"k%06d" % n + b"n" for n in random.Random(8).sample(range(10**6), 400)]
    sock = stalled_export(server, tokens["full"], "racing")
    # The stalled export is aborted after SEND_TIMEOUT without progress: the writes stop at half of it, so a
    # busy machine races fewer of them rather than losing the export (800 writes lost it in a clean-clone run).
    stop_writing = time.monotonic() + SEND_TIMEOUT / 2
    headers = {**tokens["full"], "Content-Type": "application/json"}
    deleted, created = [], []
    with requests.Session() as writer:
        for doc_id, new_id in zip(doomed, born):
            if time.monotonic() > stop_writing:
                break
            assert writer.delete(server.url(f"/v1/racing/{doc_id.decode()}"), headers=headers).status_code == 204
            deleted.append(doc_id)
            assert writer.put(server.url(f"/v1/racing/{new_id.decode()}"), data=b'{"new":1}', headers=headers).ok
            created.append(new_id)
    _, body = read_all(sock)
    sock.close()
    assert deleted  # some writes raced the export
    lines = body.splitlines()
    by_body = {stored: doc_id for doc_id, stored in docs.items()}  # each body is its document's alone ("n")
    exported = [by_body[line] for line in lines if line != b'{"new":1}']
    assert exported == sorted(set(exported))  # in id order, none twice
    assert set(docs) - set(deleted) <= set(exported)
    assert len(lines) - len(exported) <= len(created)


def test_a_range_that_fails_mid_export_ends_the_body_without_its_last_chunk(server, tokens, redis_stats):
    # ~12 MB in 6,000 ids: the export is still under way, held by its client, when Redis fails, and its
    # ranges of ids (~400 a range, past the first page) are far from all read.
    docs = documents(6000, pad=2000)
    load(server, tokens["full"], "failing", docs)
    sock = stalled_export(server, tokens["full"], "failing")
    time.sleep(0.5)
    # A shard's id index that is no sorted set: the scan's next range is refused (WRONGTYPE).
    redis_stats.delete(keys.index_key(b"failing", 5))
    redis_stats.set(keys.index_key(b"failing", 5), b"not a sorted set")
    with pytest.raises(AssertionError, match="ended early") as ended:
        read_all(sock)
    sock.close()
    received = str(ended.value).split("after ")[1].split(" bytes")[0]
    assert 0 < int(received) < sum(len(body) + 1 for body in docs.values())
    assert requests.get(server.url("/healthz")).status_code == 200


def test_ids_all_in_one_index_shard_are_exported_whole_and_in_order(server, tokens):
    """A page ends where the shards that answered in full end (cache/documents/scan.py): skew loses nothing."""
    one_shard = [doc_id for doc_id in (b"s%05d" % n for n in range(40000)) if keys.shard_of(doc_id) == 0][:1500]
    docs = {doc_id: b'{"n":%d}' % n for n, doc_id in enumerate(one_shard)}
    load(server, tokens["full"], "skew", docs)
    assert export(server, tokens["full"], "skew").content == b"".join(docs[d] + b"\n" for d in sorted(docs))


def test_the_export_needs_read_scope_as_a_document_read_does(server, tokens):
    assert export(server, tokens["writer"], "exp").status_code == 403
    assert export(server, {}, "exp").status_code == 401
    assert export(server, tokens["full"], "exp", with_ids="maybe").status_code == 400
    assert export(server, tokens["full"], "exp", cursor="!!").status_code == 400


def test_an_http_1_0_export_ends_with_the_connection(server, tokens):
    docs = documents(300)
    load(server, tokens["full"], "old", docs)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    auth = tokens["full"]["Authorization"].encode()
    sock.sendall(b"GET /v1/old HTTP/1.0\r\nAccept: application/x-ndjson\r\nAuthorization: %s\r\n\r\n" % auth)
    answer = b""
    while True:
        got = sock.recv(65536)
        if not got:
            break
        answer += got
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert body == b"".join(docs[doc_id] + b"\n" for doc_id in sorted(docs))


def test_an_import_of_an_export_with_ids_stores_the_same_bytes(server, tokens):
    docs = documents(1200)
    load(server, tokens["full"], "src", docs)
    dump = export(server, tokens["full"], "src", with_ids="1").content
    odd = b'{ "doc" : {"a": [1, 2]},  "id": "odd"}\n'  # not the export's form: stored compact
    reply = requests.post(
        server.url("/v1/_import/dst"),
        params={"with_ids": "1"},
        data=dump + odd + b'{"id":"x","doc":{},"more":1}\n',
        headers={**tokens["full"], "Content-Type": NDJSON},
    ).json()
    assert (reply["written"], reply["refused"], reply["refusals"][0]["line"]) == (1201, 1, 1202)
    stored = export(server, tokens["full"], "dst", with_ids="1").content.splitlines()
    assert b'{"id":"odd","doc":{"a":[1,2]}}' in stored
    assert [line for line in stored if not line.startswith(b'{"id":"odd"')] == dump.splitlines()


def commands_called(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def stalled_export(server: JetwayServer, headers, collection: str) -> socket.socket:
    """An export asked by a client with a small receive buffer that reads nothing yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    auth = headers["Authorization"].encode()
    sock.sendall(
        b"GET /v1/%s HTTP/1.1\r\nHost: x\r\nAccept: %s\r\nAuthorization: %s\r\n\r\n"
        % (collection.encode(), NDJSON.encode(), auth)
    )
    return sock


def read_all(sock: socket.socket) -> Tuple[bytes, bytes]:
    """The head and the de-chunked body of a chunked answer (in bytearrays: 48 MB of bytes concatenated
    a read at a time took this PyPy process past 20 GB before its collector caught up)."""
    data = bytearray()
    sock.settimeout(20)
    while not data.endswith(b"\r\n0\r\n\r\n"):
        try:
            got = sock.recv(1 << 20)
        except OSError:  # reset: aborted
            got = b""
        if not got:
            raise AssertionError(f"the answer ended early after {len(data)} bytes")
        data += got
    at = data.index(b"\r\n\r\n") + 4
    head, body = bytes(data[:at]), bytearray()
    while True:
        size_end = data.index(b"\r\n", at)
        size = int(data[at:size_end], 16)
        if not size:
            return head, bytes(body)
        body += data[size_end + 2 : size_end + 2 + size]
        at = size_end + 2 + size + 2


@pytest.mark.slow
def test_a_client_that_does_not_read_holds_the_worker_to_about_a_page(server, tokens, redis_stats):
    docs = documents(6000, pad=8000)  # ~48 MB: ~48 pages of 1 MiB (handlers.exports.PAGE_BYTES)
    load(server, tokens["full"], "big", docs)
    worker = worker_pids(server)[0]
    pages_before, rss_before = commands_called(redis_stats, "zrangebylex"), rss_kib(worker)
    sock = stalled_export(server, tokens["full"], "big")
    time.sleep(2.0)  # < SEND_TIMEOUT: the client is slow, not gone
    # Each page is one ZRANGEBYLEX per index shard (16): the pages read while the client read nothing.
    pages_read = (commands_called(redis_stats, "zrangebylex") - pages_before) / 16
    grown_mib = (rss_kib(worker) - rss_before) / 1024
    assert pages_read <= 8, pages_read  # the kernel's buffers (4 MiB here) and one page; not 48
    assert grown_mib < 16, grown_mib
    head, body = read_all(sock)
    sock.close()
    assert b"200 OK" in head.split(b"\r\n")[0]
    expected = b"".join(docs[doc_id] + b"\n" for doc_id in sorted(docs))
    # Digests: pytest's diff of two 48 MB values takes gigabytes.
    assert (len(body), sha256(body).hexdigest()) == (len(expected), sha256(expected).hexdigest())


@pytest.mark.slow
def test_a_client_that_stops_reading_for_the_send_timeout_is_cut_off(server, tokens, redis_stats):
    load(server, tokens["full"], "cut", documents(3000, pad=8000))
    pages_before = commands_called(redis_stats, "zrangebylex")
    sock = stalled_export(server, tokens["full"], "cut")
    time.sleep(SEND_TIMEOUT + 1.5)
    with pytest.raises(AssertionError, match="ended early"):
        read_all(sock)
    sock.close()
    assert (commands_called(redis_stats, "zrangebylex") - pages_before) / 16 <= 8
    assert requests.get(server.url("/healthz")).status_code == 200
