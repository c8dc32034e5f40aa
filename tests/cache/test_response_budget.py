"""Answers composed from many stored documents stay within JETWAY_MAX_RESPONSE_BYTES (cache/documents/bounded_reads.py).

A server of its own with small limits (documents of 4 KiB at most, answers
of 16 KiB), so that a few small documents reach the budget. Redis's own
count of the bytes it sent (``INFO stats``) shows what left Redis: a refused
answer's documents never do, and an id asked many times is read once.
"""

from __future__ import annotations

import json
import zlib
from typing import Callable, Dict, Iterator, List, Tuple, TypeVar

import pytest
import redis
import requests

from cache.keys import INDEX_SHARDS, shard_of
from tests.multinode import TOPOLOGY
from tests.support import JetwayServer

MAX_BODY = 4096
BUDGET = 16384
T = TypeVar("T")
PROBLEM = "urn:jetway:problem:response-too-large"


@pytest.fixture(scope="module")
def small(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {"JETWAY_MAX_BODY": str(MAX_BODY), "JETWAY_MAX_RESPONSE_BYTES": str(BUDGET), "JETWAY_WORKERS": "1"}
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("budget") / "jetway.log", env=env)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def http(small, redis_client) -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def document(size: int, n: int = 0) -> bytes:
    """A JSON object of exactly ``size`` bytes."""
    head = b'{"n":%d,"pad":"' % n
    return head + b"x" * (size - len(head) - 2) + b'"}'


def put(http, small, path: str, body: bytes) -> None:
    response = http.put(small.url(path), data=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert response.status_code in (200, 201), response.text


def sent_by_redis(client: redis.Redis, action: Callable[[], T]) -> Tuple[int, T]:
    """What ``action`` returned, and the bytes Redis wrote to its clients meanwhile (every node's, on a cluster)."""
    before = _net_output(client)
    result = action()
    after = _net_output(client)
    info_reply = _net_output(client) - after  # the reply to the INFO of ``before`` counts in ``after``
    return after - before - info_reply, result


def _net_output(client: redis.Redis) -> int:
    stats = client.info("stats")
    if "total_net_output_bytes" in stats:
        return int(stats["total_net_output_bytes"])
    return sum(int(node["total_net_output_bytes"]) for node in stats.values())


def reset_stats(client: redis.Redis) -> None:
    """Every node's command counts back to zero (a cluster's client sends CONFIG to one node alone)."""
    if isinstance(client, redis.RedisCluster):
        client.config_resetstat(target_nodes=redis.RedisCluster.ALL_NODES)
    else:
        client.config_resetstat()


def calls(client: redis.Redis, command: str) -> int:
    """How many times ``command`` ran since ``reset_stats``: on every node, on a cluster."""
    if isinstance(client, redis.RedisCluster):
        per_node = list(client.info("commandstats", target_nodes=redis.RedisCluster.ALL_NODES).values())
    else:
        per_node = [client.info("commandstats")]
    return sum(int(stats.get(f"cmdstat_{command}", {"calls": 0})["calls"]) for stats in per_node)


def ids_in_distinct_shards(count: int) -> List[str]:
    """``count`` ids, each in an index shard of its own (one script each)."""
    by_shard: Dict[int, str] = {}
    n = 0
    while len(by_shard) < count:
        doc_id = f"d{n}"
        by_shard.setdefault(zlib.crc32(doc_id.encode()) % INDEX_SHARDS, doc_id)
        n += 1
    return list(by_shard.values())


def test_a_multi_get_past_the_budget_is_a_413_and_no_body_leaves_redis(http, small, redis_client):
    put(http, small, "/v1/users/big", document(MAX_BODY))
    sent, response = sent_by_redis(
        redis_client, lambda: http.get(small.url("/v1/users?ids=" + "big," * 4 + "big"), timeout=10)
    )
    assert response.status_code == 413
    assert response.headers["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == PROBLEM and problem["size"] == 5 * MAX_BODY and problem["limit"] == BUDGET
    assert sent < MAX_BODY


def test_the_post_form_past_the_budget_is_the_same_413(http, small, redis_client):
    put(http, small, "/v1/users/big", document(MAX_BODY))
    response = http.post(small.url("/v1/_get/users"), json={"ids": ["big"] * 400}, timeout=10)
    assert response.status_code == 413 and response.json()["type"] == PROBLEM
    assert response.json()["size"] == 400 * MAX_BODY


def test_an_id_asked_many_times_is_read_once_and_answered_each_time(http, small, redis_client):
    body = document(MAX_BODY)
    put(http, small, "/v1/users/big", body)
    sent, response = sent_by_redis(
        redis_client, lambda: http.get(small.url("/v1/users?ids=big,missing,big,big,big"), timeout=10)
    )
    assert response.status_code == 200
    assert response.content == b'{"items":[' + b",".join([body, b"null", body, body, body]) + b"]}"
    assert sent < 2 * MAX_BODY


def test_a_multi_get_of_exactly_the_budget_is_answered(http, small, redis_client):
    bodies = [document(MAX_BODY, n) for n in range(BUDGET // MAX_BODY)]
    for n, body in enumerate(bodies):
        put(http, small, f"/v1/users/u{n}", body)
    response = http.get(small.url("/v1/users?ids=" + ",".join(f"u{n}" for n in range(len(bodies)))), timeout=10)
    assert response.status_code == 200 and response.json()["items"] == [json.loads(body) for body in bodies]


def test_a_document_its_shards_share_could_not_hold_is_fetched_in_a_second_round(http, small, redis_client):
    """Eight ids in eight shards share the budget by count (2 KiB each): the 4 KiB one still comes."""
    ids = ids_in_distinct_shards(8)
    bodies = [document(MAX_BODY if n == 0 else 100, n) for n in range(8)]
    for doc_id, body in zip(ids, bodies):
        put(http, small, f"/v1/users/{doc_id}", body)
    response = http.get(small.url("/v1/users?ids=" + ",".join(ids)), timeout=10)
    assert response.status_code == 200
    assert response.content == b'{"items":[' + b",".join(bodies) + b"]}"


def test_a_page_the_budget_fills_ends_early_and_its_cursor_pages_through_everything(http, small, redis_client):
    bodies = {f"p{n:02d}": document(3000, n) for n in range(12)}
    for doc_id, body in bodies.items():
        put(http, small, f"/v1/pages/{doc_id}", body)
    seen: List[int] = []
    sizes: List[int] = []
    url = small.url("/v1/pages?limit=1000")
    while True:
        page = http.get(url, timeout=10)
        assert page.status_code == 200
        sizes.append(len(page.json()["items"]))
        seen += [item["n"] for item in page.json()["items"]]
        if page.json()["next"] is None:
            break
        url = small.url("/v1/pages?limit=1000&cursor=" + page.json()["next"])
    assert seen == list(range(12))
    assert sizes == [5, 5, 2]  # 5 x 3000 B fit in 16 KiB, 6 do not


def test_a_page_of_small_documents_is_not_cut(http, small, redis_client):
    for n in range(20):
        put(http, small, f"/v1/pages/p{n:02d}", document(200, n))
    page = http.get(small.url("/v1/pages?limit=20"), timeout=10).json()
    assert [item["n"] for item in page["items"]] == list(range(20)) and page["next"] is None


def batch(http, small, operations):
    response = http.post(small.url("/v1/_batch"), json={"operations": operations}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_batch_gets_past_the_budget_get_their_own_413_and_the_writes_still_happen(http, small, redis_client):
    put(http, small, "/v1/users/big", document(MAX_BODY))
    operations = [{"op": "get", "collection": "users", "id": "big"}] * 6
    operations.insert(2, {"op": "put", "collection": "users", "id": "w", "document": {"written": True}})
    operations.append({"op": "delete", "collection": "users", "id": "big"})
    results = batch(http, small, operations)
    statuses = [result["status"] for result in results]
    # Four gets of 4 KiB would fill 16 KiB, but the put's result carries its 16 B document: three fit.
    # The write between them and the delete after them go on.
    assert statuses == [200, 200, 201, 200, 413, 413, 413, 204]
    assert results[5]["problem"]["type"] == PROBLEM
    assert http.get(small.url("/v1/users/w"), timeout=10).json() == {"written": True}
    assert http.get(small.url("/v1/users/big"), timeout=10).status_code == 404


def test_a_batch_of_many_gets_of_one_document_reads_it_once(http, small, redis_client):
    body = document(1000)
    put(http, small, "/v1/users/one", body)
    sent, results = sent_by_redis(
        redis_client, lambda: batch(http, small, [{"op": "get", "collection": "users", "id": "one"}] * 16)
    )
    assert [result["status"] for result in results] == [200] * 16
    assert all(result["document"] == json.loads(body) for result in results)
    assert sent < 2 * len(body)


def test_a_batch_get_counts_a_document_as_an_earlier_write_of_the_batch_leaves_it(http, small, redis_client):
    put(http, small, "/v1/users/grows", document(100))
    big = json.loads(document(MAX_BODY - 100))
    operations = [
        {"op": "put", "collection": "users", "id": "grows", "document": big},
        *[{"op": "get", "collection": "users", "id": "grows"}] * 5,
    ]
    statuses = [result["status"] for result in batch(http, small, operations)]
    # The put's result carries its ~4 KiB document too: it and three gets fill the 16 KiB.
    assert statuses == [200, 200, 200, 200, 413, 413]


def test_patches_past_the_budget_are_written_and_answer_without_their_document(http, small, redis_client):
    """Each patch's merged document counts; past the budget a patch (done) answers its ETag and document_omitted."""
    for n in range(6):
        put(http, small, f"/v1/users/p{n}", document(MAX_BODY - 100, n))
    operations = [{"op": "patch", "collection": "users", "id": f"p{n}", "patch": {"seen": True}} for n in range(6)]
    operations.append({"op": "get", "collection": "users", "id": "p0"})
    results = batch(http, small, operations)
    assert [result["status"] for result in results] == [200, 200, 200, 200, 200, 200, 413]
    assert all("document" in result for result in results[:4])
    for result in results[4:6]:
        assert "document" not in result and result["document_omitted"]["type"] == PROBLEM
        assert result["document_omitted"]["status"] == 413
        stored = http.get(small.url(f"/v1/users/{result['id']}"), timeout=10)
        assert stored.json()["seen"] is True and stored.headers["ETag"].startswith(result["etag"][:-1])  # or -gzip
    assert results[6]["problem"]["type"] == PROBLEM


def test_with_return_minimal_written_documents_do_not_count(http, small, redis_client):
    put(http, small, "/v1/users/big", document(MAX_BODY))
    operations = [{"op": "patch", "collection": "users", "id": "big", "patch": {"n": n}} for n in range(6)]
    operations += [{"op": "get", "collection": "users", "id": "big"}] * 4
    response = http.post(
        small.url("/v1/_batch"), json={"operations": operations}, headers={"Prefer": "return=minimal"}, timeout=10
    )
    assert [result["status"] for result in response.json()["results"]] == [200] * 10


def test_a_batch_of_many_patches_reads_at_most_the_budget_of_documents_per_round(http, small, redis_client):
    """Segments by bytes: 12 patches of ~4 KiB documents read 16 KiB at most per round (3 a round), all written."""
    for n in range(12):
        put(http, small, f"/v1/users/q{n}", document(MAX_BODY - 100, n))
    reset_stats(redis_client)
    results = batch(
        http, small, [{"op": "patch", "collection": "users", "id": f"q{n}", "patch": {"n": -n}} for n in range(12)]
    )
    assert [result["status"] for result in results] == [200] * 12
    assert sum("document" in result for result in results) == 4  # 4 x ~4 KiB fill the 16 KiB
    # READ_ONE_WITHIN runs HMGET only for a document within its cap: each one was sent once, none over a cap (the
    # other 12 are the writes': a put reads its document's ETag and variant fields in one HMGET).
    assert calls(redis_client, "hmget") == 12 + 12
    for n in range(12):
        assert http.get(small.url(f"/v1/users/q{n}"), timeout=10).json()["n"] == -n


def test_a_batch_of_many_patches_of_small_documents_reads_them_in_one_round(http, small, redis_client):
    """The segment follows the documents' real sizes: 12 patches of 200 B documents are one read, one write."""
    for n in range(12):
        put(http, small, f"/v1/users/s{n}", document(200, n))
    reset_stats(redis_client)
    results = batch(
        http, small, [{"op": "patch", "collection": "users", "id": f"s{n}", "patch": {"n": -n}} for n in range(12)]
    )
    assert [result["status"] for result in results] == [200] * 12
    # 12 reads (READ_ONE_WITHIN), and the 12 writes in one script call per slot group (cache.batches.groups).
    groups = len({shard_of(b"s%d" % n) for n in range(12)}) if TOPOLOGY == "cluster" else 1
    assert calls(redis_client, "hstrlen") == 12 and calls(redis_client, "evalsha") == 12 + groups
