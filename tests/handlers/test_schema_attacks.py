"""Issue 44's attacks on collection schemas, through real HTTP on the session's 2-worker server and redis-server.

Each hostile schema is refused when the setting is written (a 422 that names
the limit), or each write under it is a 4xx within the validation budget
(``cache/schemas/budget.py``): never a 5xx, never a worker lost, never a
connection to an address a schema names, and ``/healthz`` answers meanwhile.
A batch holding such a write answers each operation on its own.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from typing import Iterator, List

import pytest
import requests

from tests.support import worker_pids

PROBLEM = "urn:jetway:problem:"


class Listener:
    """A TCP port on loopback that records every connection made to it (and answers none)."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.accepted: List[object] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, peer = self.socket.accept()
            except OSError:
                continue
            self.accepted.append(peer)
            connection.close()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.socket.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    try:
        yield found
    finally:
        found.close()


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def put_settings(api, collection: str, schema: object) -> requests.Response:
    return api.put_json(f"/v1/_collections/{collection}", json.dumps({"schema": schema}).encode())


def refused(response: requests.Response, slug: str, words: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"] == PROBLEM + slug and words in body["detail"], body


def nested(levels: int, key: str, inner: object) -> object:
    for _ in range(levels):
        inner = {key: inner}
    return inner


DOUBLING = {
    "$defs": {
        "n": {"allOf": [{"$ref": "#/$defs/m"}, {"$ref": "#/$defs/m"}]},
        "m": {"properties": {"x": {"$ref": "#/$defs/n"}}},
    },
    "$ref": "#/$defs/n",
}
EXPONENTIAL = {
    "$defs": {f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2} for i in range(30)},
    "$ref": "#/$defs/a0",
}
EXPONENTIAL["$defs"]["a30"] = {"type": "string"}  # type: ignore[index]


@pytest.mark.parametrize(
    "schema,words",
    [
        ({"$ref": "http://127.0.0.1:{port}/x.json"}, "never fetches"),
        ({"properties": {"a": {"$ref": "http://127.0.0.1:{port}/y.json#/a"}}}, "never fetches"),
        ({"$ref": "file:///etc/passwd"}, "never fetches"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "$ref cycle"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a", "unevaluatedProperties": False},
            "$ref cycle",
        ),
        (nested(200, "not", {}), "nested more than 48 levels"),
        ({"properties": {f"p{i}": {"type": "string"} for i in range(3000)}}, "the limit is 32768"),
        (EXPONENTIAL, "more than 2000 subschemas to one value"),
        ({"pattern": "(?=a)b"}, "lookaround is refused"),
        ({"pattern": "(a)\\1"}, "backreferences are refused"),
        ({"pattern": "(a{100}){100}"}, "more than 4000 states"),
    ],
    ids=[
        "remote-ref",
        "remote-ref-nested",
        "file-ref",
        "ref-cycle",
        "ref-cycle-unevaluated",
        "nested-200",
        "oversized",
        "exponential-allof",
        "lookaround",
        "backreference",
        "pattern-expands",
    ],
)
def test_a_hostile_schema_is_refused_with_a_422_naming_why_and_nothing_is_fetched(api, listener, schema, words):
    text = json.dumps(schema).replace("{port}", str(listener.port))
    response = api.put_json(f"/v1/_collections/{fresh('hostile')}", json.dumps({"schema": json.loads(text)}).encode())
    refused(response, "invalid-schema", words)
    time.sleep(0.05)
    assert listener.accepted == [], "a worker connected to an address the schema named"


WRITES = [
    ({"properties": {"s": {"pattern": "^(a+)+$"}}}, {"s": "a" * 25 + "!"}, (422,), "pattern"),
    ({"patternProperties": {"^(a+)+$": {"type": "integer"}}}, {"a" * 25 + "!": 1, "aaa": "x"}, (422,), "type"),
    (
        {"properties": {"s": {"pattern": "^(a+)+$"}}, "unevaluatedProperties": False},
        {"s": "a" * 30 + "!"},
        (422,),
        "pattern",
    ),
    # jsonschema's own unevaluatedProperties would match this key with re (cache/schemas/unevaluated.py).
    (
        {"patternProperties": {"^(a+)+$": {}}, "unevaluatedProperties": False},
        {"a" * 30 + "!": 1},
        (422,),
        "unevaluatedProperties",
    ),
    (DOUBLING, nested(60, "x", 1), (422,), "validation-budget"),
    ({"type": "object", "properties": {"c": {"$ref": "#"}}}, nested(400, "c", {}), (422,), "maxDepth"),
    # One pass, not O(n^2) pairs: 60,000 distinct objects are stored once the worker's JIT is warm; a
    # cold worker may spend its 40 ms first (the clock is the budget's backstop): either, never slow.
    # Stored once, the same PUT again replaces it: 201, then 200.
    (
        {"properties": {"u": {"uniqueItems": True}}},
        {"u": [{"a": i} for i in range(60_000)]},
        (200, 201, 422),
        "validation-budget",
    ),
]


def test_each_hostile_write_is_a_4xx_within_the_budget_and_healthz_answers_meanwhile(api, jetway):
    workers = worker_pids(jetway)
    slowest_health = [0.0]
    stop = threading.Event()

    def probe_health() -> None:
        while not stop.is_set():
            started = time.monotonic()
            assert requests.get(jetway.url("/healthz"), timeout=5).status_code == 200
            slowest_health[0] = max(slowest_health[0], time.monotonic() - started)
            time.sleep(0.01)

    prober = threading.Thread(target=probe_health, daemon=True)
    prober.start()
    try:
        for schema, document, status, keyword in WRITES:
            collection = fresh("attack")
            assert put_settings(api, collection, schema).status_code == 201
            for _ in range(3):  # each worker, most likely, and a warmed one
                started = time.monotonic()
                response = api.put_json(f"/v1/{collection}/doc", json.dumps(document).encode())
                took = time.monotonic() - started
                assert response.status_code in status, response.text[:300]
                if response.status_code == 422:
                    assert keyword in {error["keyword"] for error in response.json()["errors"]}, response.text[:300]
                assert took < 2.0, f"{schema} took {took:.2f} s"
    finally:
        stop.set()
        prober.join(10)
    assert worker_pids(jetway) == workers, "a worker died"
    # The issue's target is 100 ms; a 2-core machine shared by the suite gets slack.
    assert slowest_health[0] < 1.0, slowest_health[0]


def test_a_batch_with_a_hostile_write_answers_each_operation(api):
    collection = fresh("attack")
    assert put_settings(api, collection, {"properties": {"s": {"pattern": "^(a+)+$"}}, **DOUBLING}).status_code == 201
    operations = [
        {"op": "put", "collection": collection, "id": "good", "document": {"s": "aaa"}},
        {"op": "put", "collection": collection, "id": "redos", "document": {"s": "a" * 25 + "!"}},
        {"op": "put", "collection": collection, "id": "deep", "document": nested(60, "x", 1)},
        {"op": "patch", "collection": collection, "id": "good", "patch": {"x": nested(60, "x", 1)}},
        {"op": "get", "collection": collection, "id": "good"},
    ]
    response = api.post_json("/v1/_batch", json.dumps({"operations": operations}).encode())
    assert response.status_code == 200, response.text[:500]
    statuses = [result["status"] for result in response.json()["results"]]
    assert statuses == [201, 422, 422, 422, 200], statuses
