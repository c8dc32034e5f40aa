"""POST /v1/_batch through real HTTP: order, per-operation answers, authorization, limits, retries, replicas."""

from __future__ import annotations

import json
import signal
from typing import Any, Dict, Iterator, List

import pytest
import requests

from cache.keys import document_key
from tests.multinode import ReplicatedPair
from tests.support import JetwayServer

PROBLEM = "urn:jetway:problem:"
KEY = {"Idempotency-Key": "batch-6f1e2c"}


def batch(api, *operations: Dict[str, Any], **kwargs) -> requests.Response:
    return api.post_json("/v1/_batch", json.dumps({"operations": list(operations)}).encode(), **kwargs)


def results(response: requests.Response) -> List[Dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    return response.json()["results"]


def problem_of(result: Dict[str, Any]) -> str:
    return result["problem"]["type"][len(PROBLEM) :]


def test_each_kind_of_operation_answers_as_its_request_would(api):
    assert api.put_json("/v1/users/u1", b'{"name": "Ada"}').status_code == 201
    answer = results(
        batch(
            api,
            {"op": "get", "collection": "users", "id": "u1"},
            {"op": "put", "collection": "users", "id": "u2", "document": {"name": "Bob"}},
            {"op": "put", "collection": "users", "id": "u1", "document": {"name": "Ada", "v": 2}},
            {"op": "create", "collection": "orders", "document": {"total": 12}},
            {"op": "patch", "collection": "users", "id": "u2", "patch": {"age": 40}},
            {"op": "delete", "collection": "users", "id": "u1"},
            {"op": "get", "collection": "users", "id": "nope"},
        )
    )
    assert [result["status"] for result in answer] == [200, 201, 200, 201, 200, 204, 404]
    # A get inlines the stored bytes as they are, whitespace included.
    assert answer[0]["document"] == {"name": "Ada"} and answer[0]["etag"].startswith('"')
    single = api.get("/v1/users/u2")
    assert single.json() == answer[4]["document"] == {"name": "Bob", "age": 40}
    assert single.headers["ETag"] == answer[4]["etag"]
    created = api.get(f"/v1/orders/{answer[3]['id']}")
    assert created.status_code == 200 and created.json() == {"total": 12}
    assert created.headers["ETag"] == answer[3]["etag"]
    assert api.get("/v1/users/u1").status_code == 404
    assert problem_of(answer[6]) == "not-found" and answer[6]["problem"]["status"] == 404


def test_stored_bytes_are_inlined_verbatim(api):
    assert api.put_json("/v1/users/u1", b'{ "a" :  1 }').status_code == 201
    response = batch(api, {"op": "get", "collection": "users", "id": "u1"})
    assert b'"document":{ "a" :  1 }' in response.content


def test_a_put_or_create_stores_its_documents_own_bytes_as_a_single_put_does(api):
    """The document's bytes in the batch's body, spaces, escapes and all: not a re-encoding of its value."""
    document = b'{ "a" : "\\u00e9t\xc3\xa9 \\"}{[",\n  "b":[1, 2.50, {}] }'
    head = b'{"operations": [{"op": "put", "collection": "users", "id": "v1", "document" :  '
    body = head + document + b' }, {"op":"create","collection":"users","document":' + document + b"}]}"
    response = api.post_json("/v1/_batch", body)
    answer = results(response)
    assert [result["status"] for result in answer] == [201, 201]
    assert api.get("/v1/users/v1").content == document
    assert api.get(f"/v1/users/{answer[1]['id']}").content == document
    assert response.content.count(b'"document":' + document + b"}") == 2
    assert api.put_json("/v1/users/v2", document).status_code == 201
    assert api.get("/v1/users/v2").content == document


def test_operations_take_effect_in_order_within_one_batch(api):
    answer = results(
        batch(
            api,
            {"op": "put", "collection": "users", "id": "u1", "document": {"n": 1}},
            {"op": "patch", "collection": "users", "id": "u1", "patch": {"m": 2}},
            {"op": "patch", "collection": "users", "id": "u1", "patch": {"n": None}},
            {"op": "get", "collection": "users", "id": "u1"},
            {"op": "delete", "collection": "users", "id": "u1"},
            {"op": "get", "collection": "users", "id": "u1"},
            {"op": "patch", "collection": "users", "id": "u1", "patch": {"n": 3}},
        )
    )
    assert [result["status"] for result in answer] == [201, 200, 200, 200, 204, 404, 404]
    assert answer[1]["document"] == {"n": 1, "m": 2}
    assert answer[2]["document"] == answer[3]["document"] == {"m": 2}
    assert answer[3]["etag"] == answer[2]["etag"]


def test_one_operation_failing_leaves_the_others_done(api, redis_client):
    assert api.put_json("/v1/users/u1", b'{"n":1}').status_code == 201
    answer = results(
        batch(
            api,
            {"op": "put", "collection": "users", "id": "u1", "document": {"n": 2}, "if_match": '"stale"'},
            {"op": "put", "collection": "users", "id": "u1", "document": {"n": 3}, "if_none_match": "*"},
            {"op": "put", "collection": "Users", "id": "u9", "document": {}},
            {"op": "put", "collection": "users", "id": "u2", "document": [1]},
            {"op": "get", "collection": "users"},
            {"op": "frobnicate", "collection": "users", "id": "u1"},
            {"op": {}, "collection": "users", "id": "u1"},  # an object or array op was a 500 (schemathesis 4.20)
            {"op": ["get"], "collection": "users", "id": "u1"},
            {"op": "get", "collection": "users", "id": "u1", "extra": 1},
            {"op": "put", "collection": "users", "id": "u3", "document": {}, "ttl": True},
            {"op": "patch", "collection": "users", "id": "nope", "patch": {"a": 1}},
            {"op": "delete", "collection": "users", "id": "u1", "if_match": '"stale"'},
            {"op": "put", "collection": "users", "id": "u4", "document": {"ok": True}},
        )
    )
    statuses = [(result["status"], problem_of(result) if "problem" in result else None) for result in answer]
    assert statuses == [
        (412, "precondition-failed"),
        (412, "precondition-failed"),
        (400, "invalid-collection"),
        (400, "not-an-object"),
        (400, "invalid-batch"),
        (400, "invalid-batch"),
        (400, "invalid-batch"),
        (400, "invalid-batch"),
        (400, "invalid-batch"),
        (400, "invalid-ttl"),
        (404, "not-found"),
        (412, "precondition-failed"),
        (201, None),
    ]
    assert api.get("/v1/users/u1").json() == {"n": 1}
    assert api.get("/v1/users/u4").json() == {"ok": True}
    assert redis_client.exists(document_key(b"users", b"u3")) == 0


def test_conditions_and_ttl_as_on_a_single_request(api, redis_client):
    etag = api.put_json("/v1/users/u1", b'{"n":1}').headers["ETag"]
    answer = results(
        batch(
            api,
            {"op": "put", "collection": "users", "id": "u1", "document": {"n": 2}, "if_match": etag, "ttl": 100},
            {"op": "create", "collection": "users", "document": {"n": 3}, "ttl": 50},
            {"op": "put", "collection": "users", "id": "u1", "document": {"n": 4}, "if_match": etag},
        )
    )
    assert [result["status"] for result in answer] == [200, 201, 412]
    assert 90 < redis_client.ttl(document_key(b"users", b"u1")) <= 100
    assert 40 < redis_client.ttl(document_key(b"users", answer[1]["id"].encode())) <= 50
    assert api.get("/v1/users/u1").json() == {"n": 2}


def test_return_minimal_leaves_written_documents_out(api):
    answer = results(
        batch(
            api,
            {"op": "put", "collection": "users", "id": "u1", "document": {"n": 1}},
            {"op": "get", "collection": "users", "id": "u1"},
            headers={"Prefer": "return=minimal"},
        )
    )
    assert set(answer[0]) == {"status", "id", "etag"}
    assert answer[1]["document"] == {"n": 1}


def test_the_batch_is_refused_whole_when_malformed(api, redis_client):
    for body in (b"[]", b'{"operations": []}', b'{"operations": {}}', b'{"operations": [], "x": 1}', b"{"):
        response = api.post_json("/v1/_batch", body)
        assert response.status_code == 400, body
        assert response.headers["Content-Type"] == "application/problem+json"
    too_many = [{"op": "put", "collection": "users", "id": f"u{n}", "document": {}} for n in range(1001)]
    response = batch(api, *too_many)
    assert response.status_code == 413 and response.json()["type"] == PROBLEM + "batch-too-large"
    assert redis_client.exists(document_key(b"users", b"u0")) == 0
    assert api.post_json("/v1/_batch", b'{"operations": []}', content_type="text/plain").status_code == 415


def test_a_thousand_operations_in_one_batch(api):
    body = {"pad": "x" * 1000}
    answer = results(
        batch(api, *({"op": "put", "collection": "bulk", "id": f"d{n}", "document": body} for n in range(1000)))
    )
    assert [result["status"] for result in answer] == [201] * 1000
    reads = results(batch(api, *({"op": "get", "collection": "bulk", "id": f"d{n}"} for n in range(1000))))
    assert all(result["document"] == body for result in reads)


def test_each_operation_is_authorized_on_its_collection(api, jetway):
    token = jetway.make_token("mixed", "read:users", "write:orders")
    auth = {"Authorization": f"Bearer {token}"}
    answer = results(
        batch(
            api,
            {"op": "get", "collection": "users", "id": "u1"},
            {"op": "put", "collection": "users", "id": "u1", "document": {}},
            {"op": "create", "collection": "orders", "document": {}},
            {"op": "get", "collection": "orders", "id": "o1"},
            headers=auth,
        )
    )
    assert [(result["status"], problem_of(result)) for result in answer if "problem" in result] == [
        (404, "not-found"),
        (403, "forbidden"),
        (403, "forbidden"),
    ]
    assert answer[2]["status"] == 201
    assert api.get("/v1/users/u1").status_code == 404
    unauthenticated = requests.post(jetway.url("/v1/_batch"), json={"operations": [{}]}, timeout=10)
    assert unauthenticated.status_code == 401


def test_a_batch_costs_one_request_per_operation_of_the_rate(api, jetway):
    token = jetway.make_token("rated", "read:*", rate="10/m")
    auth = {"Authorization": f"Bearer {token}"}
    six = [{"op": "get", "collection": "users", "id": f"u{n}"} for n in range(6)]
    first = batch(api, *six, headers=auth)
    assert first.status_code == 200 and int(first.headers["RateLimit-Remaining"]) == 4
    second = batch(api, *six, headers=auth)
    assert second.status_code == 429 and second.json()["type"] == PROBLEM + "rate-limited"
    assert int(second.headers["Retry-After"]) >= 1
    eleven = [{"op": "get", "collection": "users", "id": f"u{n}"} for n in range(11)]
    too_large = batch(api, *eleven, headers=auth)
    assert too_large.status_code == 413 and too_large.json()["type"] == PROBLEM + "batch-too-large"


def test_a_retried_batch_is_answered_once(api):
    operations = [
        {"op": "create", "collection": "orders", "document": {"total": 1}},
        {"op": "put", "collection": "orders", "id": "o1", "document": {"total": 2}},
    ]
    first = batch(api, *operations, headers=KEY)
    again = batch(api, *operations, headers=KEY)
    assert again.headers["Idempotency-Replayed"] == "true" and "Idempotency-Replayed" not in first.headers
    assert again.content == first.content
    assert [result["status"] for result in results(first)] == [201, 201]
    assert len(api.get("/v1/orders").json()["items"]) == 2
    other = batch(api, operations[0], headers=KEY)
    assert other.status_code == 422 and other.json()["type"] == PROBLEM + "idempotency-key-reused"


# -- limits set by the operator, and the write concern: servers of their own --


@pytest.fixture
def small_batches(redis_server, tmp_path) -> Iterator[JetwayServer]:
    env = {"JETWAY_MAX_BATCH_OPS": "3", "JETWAY_MAX_BATCH_BYTES": "4096", "JETWAY_MAX_BODY": "2048"}
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log", env=env)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


def post(server: JetwayServer, *operations: Dict[str, Any], **headers: str) -> requests.Response:
    body = json.dumps({"operations": list(operations)})
    return requests.post(
        server.url("/v1/_batch"), data=body, headers={"Content-Type": "application/json", **headers}, timeout=10
    )


def test_operator_limits_on_operations_bytes_and_each_document(small_batches):
    assert post(small_batches, *[{"op": "get", "collection": "c", "id": "a"}] * 4).json()["type"] == (
        PROBLEM + "batch-too-large"
    )
    # More than JETWAY_MAX_BODY in all is fine for a batch, up to JETWAY_MAX_BATCH_BYTES.
    fits = [{"op": "put", "collection": "c", "id": f"d{n}", "document": {"p": "x" * 1200}} for n in range(3)]
    assert [result["status"] for result in results(post(small_batches, *fits))] == [201, 201, 201]
    over = post(small_batches, {"op": "put", "collection": "c", "id": "big", "document": {"p": "x" * 5000}})
    assert over.status_code == 413 and over.json()["type"] == PROBLEM + "body-too-large"
    one_too_big = post(small_batches, {"op": "put", "collection": "c", "id": "big", "document": {"p": "x" * 2100}})
    assert [(r["status"], problem_of(r)) for r in results(one_too_big)] == [(413, "body-too-large")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Iterator[ReplicatedPair]:
    servers = ReplicatedPair(tmp_path_factory.mktemp("replicated"))
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def one_replica(pair, tmp_path) -> Iterator[JetwayServer]:
    env = {"JETWAY_WRITE_REPLICAS": "1", "JETWAY_WRITE_TIMEOUT": "0.3"}
    server = JetwayServer(pair.url, tmp_path / "jetway.log", env=env)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


def test_writes_are_answered_once_a_replica_has_them(pair, one_replica):
    operations = [{"op": "put", "collection": "wc", "id": f"d{n}", "document": {"n": n}} for n in range(20)]
    assert [result["status"] for result in results(post(one_replica, *operations))] == [201] * 20
    with pair.replica.client() as replica:
        # As json.dumps wrote each document in the body: stored verbatim.
        assert [replica.hget(document_key(b"wc", b"d%d" % n), "b") for n in range(20)] == [
            b'{"n": %d}' % n for n in range(20)
        ]
    pair.replica.process.send_signal(signal.SIGSTOP)
    try:
        answer = results(
            post(
                one_replica,
                {"op": "put", "collection": "wc", "id": "late", "document": {}},
                {"op": "get", "collection": "wc", "id": "d1"},
            )
        )
    finally:
        pair.replica.process.send_signal(signal.SIGCONT)
    assert answer[0]["status"] == 503 and problem_of(answer[0]) == "not-replicated"
    assert answer[1]["status"] == 200
