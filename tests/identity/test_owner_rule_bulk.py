"""The owner rule on the bulk operations, end to end (node-oidc-provider's tokens): the NDJSON export, the
NDJSON import, and the change feed's tickets of a bound user (``tests/identity/test_owner_rule.py`` has the rest)."""

from __future__ import annotations

import base64
import json
from typing import List

from tests.identity import owner_people

server, people = owner_people.server, owner_people.people  # the fixtures

NDJSON = {"Accept": "application/x-ndjson"}


def lines(text: str) -> List[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_an_export_holds_only_the_callers_documents_and_a_services_holds_all(people):
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


def ndjson_import(caller, query: str, *documents: dict, **headers: str):
    body = b"".join(json.dumps(document).encode() + b"\n" for document in documents)
    return caller.send(
        "POST", f"/v1/_import/notes?{query}", body, **{"Content-Type": "application/x-ndjson", **headers}
    )


def test_an_import_writes_each_line_as_the_callers_put_would_be(people):
    """alice's lines create and replace her documents; a line naming bob as owner, and one over bob's
    document, are refused by number (403) and bob's document is as it was."""
    alice, bob, service = people["alice"], people["bob"], people["service"]
    assert alice.send("PUT", "/v1/notes/mine", {"v": 0}).status_code == 201
    assert bob.send("PUT", "/v1/notes/his", {"v": 0}).status_code == 201
    before = service.send("GET", "/v1/notes/his")
    imported = ndjson_import(
        alice,
        "id_field=k",
        {"k": "i1", "v": 1},
        {"k": "i2", "v": 2, "owner": "bob"},  # given away: 403
        {"k": "his", "v": 666},  # bob's document: 403
        {"k": "his", "v": 666, "owner": "alice"},  # taken over: 403
        {"k": "mine", "v": 1},  # hers: replaced
        {"k": "i3", "v": 3, "owner": "alice"},
    )
    assert imported.status_code == 200, imported.text
    report = imported.json()
    assert (report["created"], report["replaced"], report["refused"]) == (2, 1, 3)
    assert sorted((refusal["line"], refusal["status"]) for refusal in report["refusals"]) == [
        (2, 403),
        (3, 403),
        (4, 403),
    ]
    assert alice.send("GET", "/v1/notes/i1").json() == {"k": "i1", "v": 1, "owner": "alice"}
    assert alice.send("GET", "/v1/notes/mine").json() == {"k": "mine", "v": 1, "owner": "alice"}
    assert service.send("GET", "/v1/notes/i2").status_code == 404
    after = service.send("GET", "/v1/notes/his")
    assert (after.json(), after.headers["ETag"]) == (before.json(), before.headers["ETag"])
    made = ndjson_import(bob, "", {"v": 7}).json()  # a new id: bob's
    assert made["created"] == 1
    assert sorted(doc["v"] for doc in lines(bob.send("GET", "/v1/notes", **NDJSON).text)) == [0, 7]


def test_a_bound_import_over_many_groups_writes_a_document_named_twice_in_order(people):
    """Line 1 and line 150 (another group) write one document: the second is pinned to what the first left."""
    alice = people["alice"]
    documents = [{"k": "dup", "v": 1}, *({"k": f"n{at:03}"} for at in range(148)), {"k": "dup", "v": 2}]
    report = ndjson_import(alice, "id_field=k", *documents, **{"Idempotency-Key": "bulk-1"}).json()
    assert (report["created"], report["replaced"], report["refused"]) == (149, 1, 0), report
    assert alice.send("GET", "/v1/notes/dup").json() == {"k": "dup", "v": 2, "owner": "alice"}
