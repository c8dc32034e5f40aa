"""cache.schemas.versions: schemas compiled once per settings version, off the reactor, refusals kept.

First alone (a synchronous runner stands in for the thread pool, so the
bookkeeping can be counted); then through real HTTP on the session's
2-worker server and redis-server: settings stored by an earlier version
whose schema this one refuses, written into Redis as
``cache.collection_settings`` writes them, make every write to the
collection a 409 ``stored-schema-refused`` (PUT by the direct path and the
handler, POST, PATCH, a batch's own operation) while reads, the setting's
GET and other collections carry on; storing new settings ends it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, List

import pytest
import requests
from twisted.internet import defer

from cache.collection_settings import CHANGED_CHANNEL, NAMES_KEY, settings_key
from cache.keys import document_key
from cache.schemas.bounds import MAX_SCHEMA_BYTES
from cache.schemas.schema import CompiledSchema, InvalidSchema
from cache.schemas.versions import SchemaVersions

PROBLEM = "urn:jetway:problem:"


class Held:
    """A runner that holds each compile until released: what the thread pool does, counted."""

    def __init__(self) -> None:
        self.held: List[Callable[[], None]] = []

    def __call__(self, function: Callable[..., Any], *args: Any) -> defer.Deferred:
        done: defer.Deferred = defer.Deferred()
        self.held.append(lambda: done.callback(function(*args)))
        return done

    def release(self) -> None:
        while self.held:
            self.held.pop(0)()


def result_of(deferred: defer.Deferred) -> Any:
    """What ``deferred`` fired with (a failure is consumed); it keeps firing with a success."""
    found: List[Any] = []
    deferred.addCallbacks(lambda value: found.append(value) or value, found.append)
    assert found, "still waiting"
    return found[0]


def test_one_compile_per_version_however_many_ask_while_it_runs():
    runner = Held()
    versions = SchemaVersions(None, run=runner)
    asks = [versions.outcome("c", b"e1", {"type": "object"}) for _ in range(50)]
    assert versions.compiles == 1 and len(runner.held) == 1
    runner.release()
    first = result_of(asks[0])
    assert isinstance(first, CompiledSchema) and all(result_of(ask) is first for ask in asks)
    assert result_of(versions.outcome("c", b"e1", {"type": "object"})) is first
    assert versions.compiles == 1


def test_a_refusal_is_kept_per_version_and_a_new_version_compiles_again():
    runner = Held()
    versions = SchemaVersions(None, run=runner)
    cycle = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    asking = versions.outcome("c", b"e1", cycle)
    runner.release()
    refused = result_of(asking)
    assert isinstance(refused, InvalidSchema) and "cycle" in str(refused)
    for _ in range(100):
        assert result_of(versions.outcome("c", b"e1", cycle)) is refused
    assert versions.compiles == 1
    asking = versions.outcome("c", b"e2", {"type": "object"})
    runner.release()
    assert isinstance(result_of(asking), CompiledSchema) and versions.compiles == 2


def test_compiles_take_turns_one_at_a_time():
    runner = Held()
    versions = SchemaVersions(None, run=runner)
    asks = [versions.outcome(f"c{n}", b"e", {"type": "object"}) for n in range(3)]
    assert len(runner.held) == 1, "the second waits for the first"
    runner.release()  # each finished compile lets the next one start, in the same loop
    assert all(isinstance(result_of(ask), CompiledSchema) for ask in asks)


def test_a_settings_put_compile_fails_with_the_reason_and_is_not_kept():
    versions = SchemaVersions(None, run=lambda function, *args: defer.succeed(function(*args)))
    failed = result_of(versions.compile({"pattern": "(a)\\1"}))
    assert failed.check(InvalidSchema) and "pattern" in str(failed.value)
    assert isinstance(result_of(versions.compile({"type": "object"})), CompiledSchema)


def test_a_crash_inside_a_compile_is_a_refusal_kept_like_one(monkeypatch):
    versions = SchemaVersions(None, run=lambda function, *args: defer.fail(RuntimeError("boom")))
    refused = result_of(versions.outcome("c", b"e", {"type": "object"}))
    assert isinstance(refused, InvalidSchema) and "RuntimeError" in str(refused)
    assert result_of(versions.outcome("c", b"e", {"type": "object"})) is refused and versions.compiles == 1


# -- over HTTP -------------------------------------------------------------------------


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def store_raw(redis_client, collection: str, values: dict) -> None:
    """Settings written as an earlier version stored them (no check): the hash, the name, the message."""
    body = json.dumps(values, separators=(",", ":")).encode()
    redis_client.hset(settings_key(collection.encode()), mapping={"s": body, "e": f'"old-{uuid.uuid4().hex}"'})
    redis_client.zadd(NAMES_KEY, {collection: 0})
    redis_client.publish(CHANGED_CHANNEL, collection)


def every_worker_sees(api, path: str, seen: Callable[[Any], bool]) -> None:
    """Wait until ``seen`` holds for 10 answers in a row to ``GET path``, each on a new connection (so on any
    worker): a settings change reaches a worker by a published message, a moment after it is stored."""
    deadline = time.monotonic() + 10
    in_a_row = 0
    while in_a_row < 10:
        assert time.monotonic() < deadline, f"the workers did not all see the change of {path} in time"
        answer = requests.get(api.server.url(path), headers={**api.auth_header, "Connection": "close"}, timeout=10)
        in_a_row = in_a_row + 1 if seen(answer) else 0


def refused_write(response, words: str) -> None:
    assert response.status_code == 409, response.text
    problem = response.json()
    assert problem["type"] == PROBLEM + "stored-schema-refused", problem
    assert words in problem["detail"] and "PUT /v1/_collections/" in problem["detail"], problem


def over_the_size_limit() -> dict:
    return {"properties": {f"p{n}": {"type": "string"} for n in range(MAX_SCHEMA_BYTES // 20)}}


REFUSED = [
    ("remote-ref", {"$ref": "http://127.0.0.1:9/x.json"}, "never fetches"),
    ("ref-cycle", {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "cycle"),
    ("backreference", {"properties": {"s": {"pattern": "^(a)\\1$"}}}, "pattern"),
    ("too-large", over_the_size_limit(), "the limit is"),
]


@pytest.mark.parametrize("kind,schema,words", REFUSED, ids=[kind for kind, _, _ in REFUSED])
def test_writes_to_a_collection_whose_stored_schema_is_refused_are_409s_and_reads_carry_on(
    api, redis_client, kind, schema, words
):
    name = fresh(kind)
    assert api.put_json(f"/v1/{name}/kept", b'{"a":1}').status_code == 201
    store_raw(redis_client, name, {"schema": schema, "cache_control": "max-age=7"})
    every_worker_sees(api, f"/v1/{name}/kept", lambda read: read.headers.get("Cache-Control") == "max-age=7")
    for _ in range(4):  # both workers, the direct write path once the settings are known
        refused_write(api.put_json(f"/v1/{name}/d", b'{"a":2}'), words)
    refused_write(api.put_json(f"/v1/{name}/d", b'{"a":2}', headers={"If-None-Match": "*"}), words)
    refused_write(api.post_json(f"/v1/{name}", b'{"a":3}'), words)
    refused_write(api.patch_merge(f"/v1/{name}/kept", b'{"a":4}'), words)
    operations = [
        {"op": "put", "collection": name, "id": "b", "document": {}},
        {"op": "get", "collection": name, "id": "kept"},
    ]
    answer = api.post_json("/v1/_batch", json.dumps({"operations": operations}).encode())
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["results"]
    assert first["status"] == 409 and first["problem"]["type"] == PROBLEM + "stored-schema-refused", first
    assert second["status"] == 200 and second["document"] == {"a": 1}, second
    for _ in range(4):
        read = api.get(f"/v1/{name}/kept")
        assert read.status_code == 200 and read.json() == {"a": 1}
        assert read.headers["Cache-Control"] == "max-age=7", "the rest of the settings still apply"
    assert api.get(f"/v1/{name}").status_code == 200
    shown = api.get(f"/v1/_collections/{name}")
    assert shown.status_code == 200 and shown.json()["schema"] == schema
    assert not redis_client.exists(document_key(name.encode(), b"d")) and api.get(f"/v1/{name}/d").status_code == 404


def test_storing_new_settings_ends_the_refusal_on_every_worker(api, redis_client):
    name = fresh("fixed")
    assert api.put_json(f"/v1/{name}/kept", b'{"a":0}').status_code == 201
    store_raw(redis_client, name, {"schema": {"pattern": "(?=a)"}, "cache_control": "max-age=7"})
    every_worker_sees(api, f"/v1/{name}/kept", lambda read: read.headers.get("Cache-Control") == "max-age=7")
    for _ in range(4):
        refused_write(api.put_json(f"/v1/{name}/d", b'{"a":1}'), "pattern")
    fixed_settings = {"schema": {"required": ["a"]}, "cache_control": "max-age=9"}
    fixed = api.put_json(f"/v1/_collections/{name}", json.dumps(fixed_settings).encode())
    assert fixed.status_code == 200, fixed.text
    every_worker_sees(api, f"/v1/{name}/kept", lambda read: read.headers.get("Cache-Control") == "max-age=9")
    statuses = set()
    for n in range(6):
        statuses.add(api.put_json(f"/v1/{name}/d{n}", b'{"a":1}').status_code)
        statuses.add(api.put_json(f"/v1/{name}/e{n}", b"{}").status_code)
    assert statuses == {201, 422}, statuses
