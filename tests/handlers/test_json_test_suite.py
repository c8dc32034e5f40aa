"""JSONTestSuite (nst/JSONTestSuite, vendored under tests/data/json_test_suite) through every write path.

Every body that is not JSON (``n_``) is a 400 on every path; every valid
object (``y_``) is stored byte-exact where bodies are stored verbatim, and
equal where they are re-serialized (the batch); an ``i_`` body is a 400 or
stored exactly; nothing is ever a 5xx. I-JSON refuses two ``y_`` objects
(a repeated name) and lone surrogates; documents are objects, so a valid
non-object is a 400 (``not-an-object``). Each valid value and each ``i_``
one is also sent wrapped as ``{"v": value}``, so the suite's arrays,
strings and numbers reach the store too. Every path of the codec's
``loads`` on a body: grep ``validation.json_document`` in ``handlers/``.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import pytest

from cache.json.merge_patch import merge_patch

SUITE = Path(__file__).resolve().parents[1] / "data" / "json_test_suite" / "test_parsing"
# Valid RFC 8259 that I-JSON (RFC 7493) refuses: a name given twice.
I_JSON_REFUSED = {"y_object_duplicated_key.json", "y_object_duplicated_key_and_value.json"}
COLLECTION = "jts"


class Body(NamedTuple):
    name: str
    data: bytes

    @property
    def kind(self) -> str:
        return self.name[0]  # y, n or i

    @property
    def must_store(self) -> bool:
        """Valid I-JSON whose top level is an object: a document."""
        return self.kind == "y" and self.data.lstrip(b" \t\r\n")[:1] == b"{" and self.name not in I_JSON_REFUSED


def suite() -> List[Body]:
    files = sorted(SUITE.glob("*.json"))
    assert len(files) == 318
    return [Body(path.name, path.read_bytes()) for path in files]


def wrapped(found: List[Body]) -> List[Body]:
    return [
        Body(body.name.replace(".json", " wrapped"), b'{"v":' + body.data + b"}")
        for body in found
        if body.kind in "yi" and body.name not in I_JSON_REFUSED
    ]


SUITE_BODIES = suite()
WRAPPED_BODIES = wrapped(SUITE_BODIES)


class Client:
    """One keep-alive connection with the suite's token: ~2,500 requests in a few seconds (``requests`` is slower)."""

    def __init__(self, port: int, authorization: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.authorization = authorization

    def send(self, method: str, path: str, body: bytes = b"", headers: Optional[Dict[str, str]] = None):
        headers = {"Authorization": self.authorization, "Content-Type": "application/json", **(headers or {})}
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        content = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.connection.close()  # reopened by the next request
        return response.status, response, content

    def status(self, method: str, path: str, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> int:
        return self.send(method, path, body, headers)[0]


@pytest.fixture
def client(api) -> Iterator[Client]:
    client = Client(api.server.port, api.auth_header["Authorization"])
    try:
        yield client
    finally:
        client.connection.close()


class Outcome(NamedTuple):
    status: int
    stored: Optional[bytes]  # the document's bytes as a GET returns them, when written


Send = Callable[..., Outcome]


def stored_at(client: Client, path: str) -> bytes:
    status, _, content = client.send("GET", path)
    assert status == 200, (path, status)
    return content


def put(client: Client, number: int, data: bytes, query: str = "") -> Outcome:
    path = f"/v1/{COLLECTION}/put{query and 'h'}{number}"
    status = client.status("PUT", path + query, data)
    return Outcome(status, stored_at(client, path) if status in (200, 201) else None)


def post(client: Client, number: int, data: bytes, headers: Optional[Dict[str, str]] = None) -> Outcome:
    status, response, _ = client.send("POST", f"/v1/{COLLECTION}", data, headers)
    return Outcome(status, stored_at(client, response.getheader("Location")) if status == 201 else None)


def patch(client: Client, number: int, data: bytes) -> Outcome:
    """A merge patch of ``{}``: what is stored is the patch's value (less its nulls), re-serialized."""
    path = f"/v1/{COLLECTION}/patch{number}"
    assert client.status("PUT", path, b"{}") in (200, 201)
    status = client.status("PATCH", path, data, {"Content-Type": "application/merge-patch+json"})
    return Outcome(status, stored_at(client, path) if status == 200 else None)


def batch_put(client: Client, number: int, data: bytes) -> Outcome:
    """The body as a batch put's document (spliced in as text): re-serialized when stored."""
    head = b'{"operations":[{"op":"put","collection":"%s","id":"batch%d","document":' % (COLLECTION.encode(), number)
    status, _, content = client.send("POST", "/v1/_batch", head + data + b"}]}")
    if status != 200:
        return Outcome(status, None)
    status = json.loads(content)["results"][0]["status"]
    return Outcome(status, stored_at(client, f"/v1/{COLLECTION}/batch{number}") if status in (200, 201) else None)


def other(method: str, path: str) -> Send:
    """A path that reads a JSON body but stores no document: only its status counts."""

    def send(client: Client, number: int, data: bytes) -> Outcome:
        return Outcome(client.status(method, path, data), None)

    return send


PATHS: Dict[str, Tuple[Send, str]] = {
    # name: (send, how what is stored compares with the body)
    "PUT (direct write)": (put, "bytes"),
    "PUT ?ttl (handler)": (lambda client, n, data: put(client, n, data, "?ttl=600"), "bytes"),
    "POST": (post, "bytes"),
    "POST Idempotency-Key": (lambda client, n, data: post(client, n, data, {"Idempotency-Key": f'"jts-{n}"'}), "bytes"),
    "PATCH merge-patch": (patch, "merged"),
    "batch put": (batch_put, "value"),
    "POST _get": (other("POST", f"/v1/_get/{COLLECTION}"), ""),
    "PUT settings": (other("PUT", "/v1/_collections/jts-settings"), ""),
}


def verdict(body: Body, outcome: Outcome, compare: str) -> Optional[str]:
    """What is wrong with ``outcome`` for ``body``, or None."""
    if outcome.status >= 500:
        return f"{outcome.status}"
    if body.kind == "n" or body.name in I_JSON_REFUSED:
        return None if outcome.status == 400 else f"{outcome.status}, not 400"
    if not compare:
        return None  # a valid body at a path that stores none: any 4xx or 2xx
    if outcome.stored is None:
        return None if not body.must_store else f"{outcome.status}, not stored"
    if compare == "bytes":
        return None if outcome.stored == body.data else "stored other bytes"
    expected = json.loads(body.data)
    if compare == "merged":
        expected = merge_patch({}, expected)
    return None if json.loads(outcome.stored) == expected else "stored another value"


@pytest.mark.parametrize("path", PATHS)
def test_every_body_of_the_suite_through_one_write_path(client, path):
    send, compare = PATHS[path]
    wrong = []
    # The wrapped values through the paths that store: the others would only say 400 or 2xx again.
    for number, body in enumerate(SUITE_BODIES + (WRAPPED_BODIES if compare else [])):
        problem = verdict(body, send(client, number, body.data), compare)
        if problem is not None:
            wrong.append(f"{body.name}: {problem}")
    assert wrong == []


LAX_DECODER_BODIES = [
    b'{"a":"\\u 123"}',
    b'{"a":"\\u+123"}',
    b'{"a":"\\u1_23"}',
    b'{"a":"\\u-123"}',
    '{"a":"\\uD\uff1800"}'.encode(),
    '{"a":1\u0661}'.encode(),
    '{"a":1e\u0665}'.encode(),
    b'{"a":' + b"1" * 4301 + b"}",
]


@pytest.mark.parametrize("path", PATHS)
def test_what_a_lax_decoder_took_or_failed_on_is_a_400_on_every_path(client, path):
    send, _ = PATHS[path]
    statuses = [send(client, number, data).status for number, data in enumerate(LAX_DECODER_BODIES)]
    assert statuses == [400] * len(LAX_DECODER_BODIES)
