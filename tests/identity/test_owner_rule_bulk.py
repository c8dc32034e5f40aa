"""The owner rule on the bulk operations, end to end (node-oidc-provider's tokens): the NDJSON export, the
NDJSON import, and the change feed's tickets of a bound user (``tests/identity/test_owner_rule.py`` has the rest)."""

from __future__ import annotations

import base64
import json
from typing import List

from tests.identity.test_owner_rule import people, server  # noqa: F401 (fixtures)

NDJSON = {"Accept": "application/x-ndjson"}


def lines(text: str) -> List[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_an_export_holds_only_the_callers_documents_and_a_services_holds_all(people):  # noqa: F811
    alice, bob, service = people["alice"], people["bob"], people["service"]
    for name in ("a1", "a2", "a3"):
        assert alice.send("PUT", f"/v1/notes/{name}", {"n": name}).status_code == 201
    for name in ("b1", "b2"):
        assert bob.send("PUT", f"/v1/notes/{name}", {"n": name}).status_code == 201
    exported = alice.send("GET", "/v1/notes", **NDJSON)
    assert exported.status_code == 200, exported.text
    assert exported.headers["Content-Type"].startswith("application/x-ndjson")
    assert "X-Jetway-Documents" not in exported.headers  # the collection's count is not alice's to know
    assert [doc["n"] for doc in lines(exported.text)] == ["a1", "a2", "a3"]  # in id order
    assert [doc["n"] for doc in lines(bob.send("GET", "/v1/notes", **NDJSON).text)] == ["b1", "b2"]
    with_ids = lines(alice.send("GET", "/v1/notes?with_ids=1", **NDJSON).text)
    assert [line["id"] for line in with_ids] == ["a1", "a2", "a3"] and with_ids[0]["doc"]["owner"] == "alice"
    after = base64.urlsafe_b64encode(b"a1").rstrip(b"=").decode()
    assert [doc["n"] for doc in lines(alice.send("GET", f"/v1/notes?cursor={after}", **NDJSON).text)] == ["a2", "a3"]
    everything = service.send("GET", "/v1/notes", **NDJSON)
    assert [doc["n"] for doc in lines(everything.text)] == ["a1", "a2", "a3", "b1", "b2"]
    assert everything.headers["X-Jetway-Documents"] == "5"
    assert alice.send("HEAD", "/v1/notes", **NDJSON).status_code == 200
