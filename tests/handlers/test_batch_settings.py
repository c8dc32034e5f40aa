"""``POST /v1/_batch`` under collection settings, through real HTTP on a real redis-server.

Each put, create and patch of a batch obeys its collection's settings as
its single request would: the schema (that operation's own 422
``schema-violation`` with its errors, nothing stored), ``max_bytes`` (its
own 413), the default TTL when it gives none, and ``write_replicas`` (the
batch waits for the most any of its writes asks for; each write is answered
against its own number). Every test uses collections no worker has looked
up before, so no worker holds a stale "no settings" entry for them.
"""

from __future__ import annotations

import json
import time
import uuid

import requests

from cache.keys import document_key

PROBLEM = "urn:jetway:problem:"
SCHEMA = {
    "type": "object",
    "required": ["email"],
    "properties": {"email": {"type": "string", "format": "email"}, "age": {"type": "integer", "minimum": 0}},
}


def fresh(prefix: str) -> str:
    """A collection name no worker has cached settings (or their absence) for."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def configure(api, collection: str, values: dict) -> None:
    response = api.put_json(f"/v1/_collections/{collection}", json.dumps(values).encode())
    assert response.status_code == 201, response.text


def batch(api, *operations: dict, **headers: str) -> requests.Response:
    return api.post_json("/v1/_batch", json.dumps({"operations": list(operations)}).encode(), headers=headers)


def results(api, *operations: dict) -> list:
    response = batch(api, *operations)
    assert response.status_code == 200, response.text
    return response.json()["results"]


def problem_of(result: dict, status: int, slug: str) -> dict:
    assert result["status"] == status, result
    assert result["problem"]["type"] == PROBLEM + slug, result
    assert result["problem"]["status"] == status
    return result["problem"]


def test_puts_creates_and_merged_patches_are_checked_against_the_schema(api, redis_client):
    users, free = fresh("users"), fresh("free")
    configure(api, users, {"schema": SCHEMA})
    assert api.put_json(f"/v1/{users}/old", b'{"email":"old@example.com","age":3}').status_code == 201
    answered = results(
        api,
        {"op": "put", "collection": users, "id": "ok", "document": {"email": "a@example.com"}},
        {"op": "put", "collection": users, "id": "bad", "document": {"email": "not an email", "age": -1}},
        {"op": "create", "collection": users, "document": {"age": 1}},
        {"op": "patch", "collection": users, "id": "old", "patch": {"age": -5}},
        {"op": "patch", "collection": users, "id": "old", "patch": {"age": 4}},
        {"op": "put", "collection": free, "id": "any", "document": {"age": -1}},
    )
    assert [result["status"] for result in answered] == [201, 422, 422, 422, 200, 201]
    # The same errors the single PUT of that document gets.
    alone = api.put_json(f"/v1/{users}/bad", b'{"email":"not an email","age":-1}')
    assert alone.status_code == 422
    assert problem_of(answered[1], 422, "schema-violation")["errors"] == alone.json()["errors"]
    assert {error["keyword"] for error in alone.json()["errors"]} == {"format", "minimum"}
    created = problem_of(answered[2], 422, "schema-violation")["errors"]
    assert created == [{"pointer": "", "keyword": "required", "message": created[0]["message"]}]
    patched = problem_of(answered[3], 422, "schema-violation")["errors"]
    assert [(error["pointer"], error["keyword"]) for error in patched] == [("/age", "minimum")]
    # Nothing refused was stored; the valid patch merged into the document as it was.
    assert not redis_client.exists(document_key(users.encode(), b"bad"))
    listed = api.get(f"/v1/{users}").json()["items"]
    assert sorted(item["email"] for item in listed) == ["a@example.com", "old@example.com"]
    assert api.get(f"/v1/{users}/old").json() == {"email": "old@example.com", "age": 4}


def test_max_bytes_refuses_each_operation_with_its_own_413(api, redis_client):
    small = fresh("small")
    configure(api, small, {"max_bytes": 20})
    assert api.put_json(f"/v1/{small}/p", b'{"n":1}').status_code == 201
    answered = results(
        api,
        {"op": "put", "collection": small, "id": "big", "document": {"n": "0123456789abcdef"}},
        {"op": "create", "collection": small, "document": {"n": "0123456789abcdef"}},
        {"op": "patch", "collection": small, "id": "p", "patch": {"m": "0123456789abcdef"}},
        {"op": "put", "collection": small, "id": "fits", "document": {"n": "0123"}},
    )
    for result in answered[:3]:
        assert "max_bytes" in problem_of(result, 413, "body-too-large")["detail"]
    assert answered[3]["status"] == 201
    assert not redis_client.exists(document_key(small.encode(), b"big"))
    assert api.get(f"/v1/{small}/p").json() == {"n": 1}


def test_puts_and_creates_without_ttl_get_the_collections_default(api, redis_client):
    sessions = fresh("sessions")
    configure(api, sessions, {"ttl": 3600})
    answered = results(
        api,
        {"op": "put", "collection": sessions, "id": "default", "document": {"a": 1}},
        {"op": "put", "collection": sessions, "id": "own", "document": {"a": 1}, "ttl": 60},
        {"op": "create", "collection": sessions, "document": {"a": 1}},
    )
    assert [result["status"] for result in answered] == [201, 201, 201]

    def ttl_of(doc_id: str) -> int:
        return redis_client.ttl(document_key(sessions.encode(), doc_id.encode()))

    assert 3500 < ttl_of("default") <= 3600
    assert 0 < ttl_of("own") <= 60
    assert 3500 < ttl_of(answered[2]["id"]) <= 3600
    # A patch keeps the expiry it finds, as PATCH does alone.
    patched = results(api, {"op": "patch", "collection": sessions, "id": "own", "patch": {"b": 2}})
    assert patched[0]["status"] == 200
    assert 0 < ttl_of("own") <= 60


def test_the_batch_waits_for_the_most_write_replicas_and_answers_each_write_by_its_own(api, redis_client):
    """The suite's Redis has no replica: the careful write is not-replicated, the careless one is not."""
    careful, careless = fresh("careful"), fresh("careless")
    configure(api, careful, {"write_replicas": 1})
    started = time.monotonic()
    answered = results(
        api,
        {"op": "put", "collection": careless, "id": "a", "document": {"n": 1}},
        {"op": "put", "collection": careful, "id": "b", "document": {"n": 2}},
        {"op": "get", "collection": careless, "id": "a"},
    )
    assert time.monotonic() - started < 10
    assert answered[0]["status"] == 201
    assert "0 of 1 replicas" in problem_of(answered[1], 503, "not-replicated")["detail"]
    assert answered[2]["status"] == 200
    # Not replicated is not undone: the primary has both.
    assert redis_client.exists(document_key(careful.encode(), b"b"))
    assert redis_client.exists(document_key(careless.encode(), b"a"))
    # A batch whose writes ask for no replica does not wait for one.
    alone = results(api, {"op": "put", "collection": careless, "id": "c", "document": {"n": 3}})
    assert alone[0]["status"] == 201


def test_a_schema_violation_in_a_batch_is_replayed_under_its_idempotency_key(api, redis_client):
    users = fresh("users")
    configure(api, users, {"schema": SCHEMA})
    operations = (
        {"op": "put", "collection": users, "id": "bad", "document": {"age": 1}},
        {"op": "put", "collection": users, "id": "good", "document": {"email": "g@example.com"}},
    )
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = batch(api, *operations, **key)
    assert first.status_code == 200 and "Idempotency-Replayed" not in first.headers
    again = batch(api, *operations, **key)
    assert again.headers["Idempotency-Replayed"] == "true"
    assert again.content == first.content
    assert [result["status"] for result in again.json()["results"]] == [422, 201]
    assert not redis_client.exists(document_key(users.encode(), b"bad"))
