"""Per-document rules end to end: alice and bob (node-oidc-provider's tokens) on a collection with an owner rule.

The collection ``notes`` declares ``{"owner": {"pointer": "/owner"}}``:
every user sees and writes only the documents whose ``owner`` names them;
another's is answered as a missing one. Jetway's own tokens (services, the
admin CLI) and holders of ``admin`` pass by the rule. Every operation of the
operation table is listed in ``COVERED`` with the test that shows what the
rule does to it, so an operation added without one fails
``test_every_operation_of_the_table_is_covered``.
"""

from __future__ import annotations

import requests

from handlers.operations import OPERATIONS
from tests.identity import owner_people
from tests.identity import test_owner_rule_bulk as bulk
from tests.identity.owner_people import Caller

server, people = owner_people.server, owner_people.people  # the fixtures


def test_a_users_document_is_theirs_and_another_user_sees_it_as_missing(people):
    alice, bob = people["alice"], people["bob"]
    created = alice.send("PUT", "/v1/notes/a", {"v": 1})
    assert created.status_code == 201 and created.json() == {"v": 1, "owner": "alice"}  # filled in from sub
    assert alice.send("GET", "/v1/notes/a").json() == {"v": 1, "owner": "alice"}
    missing = bob.send("GET", "/v1/notes/nothing-here")
    hidden = bob.send("GET", "/v1/notes/a")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["type"] == missing.json()["type"] and hidden.json()["detail"] == missing.json()["detail"]
    assert bob.send("HEAD", "/v1/notes/a").status_code == 404
    etag = created.headers["ETag"]
    assert bob.send("GET", "/v1/notes/a", **{"If-None-Match": etag}).status_code == 404  # not a 304
    assert alice.send("GET", "/v1/notes/a", **{"If-None-Match": etag}).status_code == 304


def test_no_user_writes_over_takes_over_or_gives_away_a_document(people):
    alice, bob = people["alice"], people["bob"]
    assert alice.send("PUT", "/v1/notes/a", {"v": 1}).status_code == 201
    assert bob.send("PUT", "/v1/notes/a", {"v": 666}).status_code == 403
    assert bob.send("PUT", "/v1/notes/a", {"v": 666, "owner": "bob"}).status_code == 403
    assert (
        bob.send("PATCH", "/v1/notes/a", {"v": 666}, **{"Content-Type": "application/merge-patch+json"}).status_code
        == 404
    )
    assert bob.send("DELETE", "/v1/notes/a").status_code == 404
    assert alice.send("PUT", "/v1/notes/b", {"v": 1, "owner": "bob"}).status_code == 403  # given away
    patch = {"Content-Type": "application/merge-patch+json"}
    assert alice.send("PATCH", "/v1/notes/a", {"owner": "bob"}, **patch).status_code == 403
    assert alice.send("PATCH", "/v1/notes/a", {"owner": None}, **patch).status_code == 403
    assert alice.send("GET", "/v1/notes/a").json() == {"v": 1, "owner": "alice"}  # none of it written
    assert alice.send("PATCH", "/v1/notes/a", {"v": 2}, **patch).json() == {"v": 2, "owner": "alice"}
    assert alice.send("PUT", "/v1/notes/a", {"v": 3, "owner": "alice"}).status_code == 200
    assert alice.send("DELETE", "/v1/notes/a").status_code == 204


def test_the_requests_own_conditions_still_hold(people):
    alice = people["alice"]
    created = alice.send("PUT", "/v1/notes/c", {"v": 1})
    assert alice.send("PUT", "/v1/notes/c", {"v": 2}, **{"If-Match": '"stale"'}).status_code == 412
    assert alice.send("PUT", "/v1/notes/c", {"v": 2}, **{"If-None-Match": "*"}).status_code == 412
    assert alice.send("PUT", "/v1/notes/c", {"v": 2}, **{"If-Match": created.headers["ETag"]}).status_code == 200
    assert alice.send("DELETE", "/v1/notes/c", **{"If-Match": created.headers["ETag"]}).status_code == 412


def test_a_create_by_post_is_its_writers(people):
    bob = people["bob"]
    created = bob.send("POST", "/v1/notes", {"v": 1})
    assert created.status_code == 201 and created.json()["owner"] == "bob"
    assert people["alice"].send("GET", created.headers["Location"]).status_code == 404
    assert bob.send("POST", "/v1/notes", {"v": 1, "owner": "alice"}).status_code == 403


def test_pages_queries_and_multi_gets_hold_only_the_callers_documents(people):
    alice, bob = people["alice"], people["bob"]
    for name in ("a1", "a2", "a3"):
        assert alice.send("PUT", f"/v1/notes/{name}", {"n": name}).status_code == 201
    for name in ("b1", "b2"):
        assert bob.send("PUT", f"/v1/notes/{name}", {"n": name}).status_code == 201
    page = alice.send("GET", "/v1/notes")
    assert page.status_code == 200, page.text
    assert sorted(item["n"] for item in page.json()["items"]) == ["a1", "a2", "a3"]
    first = alice.send("GET", "/v1/notes?limit=2").json()
    rest = alice.send("GET", f"/v1/notes?limit=2&cursor={first['next']}").json()
    assert sorted(item["n"] for item in first["items"] + rest["items"]) == ["a1", "a2", "a3"]
    assert sorted(item["n"] for item in bob.send("GET", "/v1/notes").json()["items"]) == ["b1", "b2"]
    assert bob.send("GET", "/v1/notes?_owner=eq.alice").status_code == 400  # two owners asked: refused, not shown
    by_ids = alice.send("GET", "/v1/notes?ids=a1,b1,zz").json()["items"]
    assert [item and item["n"] for item in by_ids] == ["a1", None, None]
    posted = alice.send("POST", "/v1/_get/notes", {"ids": ["b2", "a2"]}).json()["items"]
    assert [item and item["n"] for item in posted] == [None, "a2"]
    everything = people["service"].send("GET", "/v1/notes").json()["items"]
    assert sorted(item["n"] for item in everything) == ["a1", "a2", "a3", "b1", "b2"]  # a service is not bound


def test_admin_holders_and_services_pass_by_the_rule(people):
    assert people["alice"].send("PUT", "/v1/notes/a", {"v": 1}).status_code == 201
    assert people["root"].send("GET", "/v1/notes/a").json() == {"v": 1, "owner": "alice"}
    for _ in range(3):  # hot now, its owner remembered on the cached document (handlers.ownership)
        assert people["alice"].send("GET", "/v1/notes/a").status_code == 200
    assert people["service"].send("PUT", "/v1/notes/a", {"v": 2, "owner": "bob"}).status_code == 200  # reassigned
    assert people["bob"].send("GET", "/v1/notes/a").json() == {"v": 2, "owner": "bob"}
    assert people["alice"].send("GET", "/v1/notes/a").status_code == 404


def test_the_feed_of_a_user_carries_only_its_documents_and_tells_when_one_leaves(people):
    """The feed (a long poll here) of a bound user is a live query of its own documents: bob's writes are
    not in alice's; a document reassigned to bob (by a service) is in alice's once more, as no longer hers."""
    alice, bob, service = people["alice"], people["bob"], people["service"]
    since = alice.send("GET", "/v1/_changes/notes").json()["next"]
    assert alice.send("PUT", "/v1/notes/mine", {"v": 1}).status_code == 201
    assert bob.send("PUT", "/v1/notes/his", {"v": 1}).status_code == 201
    assert service.send("PUT", "/v1/notes/mine", {"v": 2, "owner": "bob"}).status_code == 200
    assert service.send("PUT", "/v1/notes/mine", {"v": 3, "owner": "bob"}).status_code == 200  # bob's now
    page = alice.send("GET", f"/v1/_changes/notes?since={since}")
    assert page.status_code == 200, page.text
    events = page.json()["events"]
    assert [(event["id"], event["matches"]) for event in events] == [("mine", True), ("mine", False)]
    # The docs lane attaches a document as it is when sent: bob's by now, so none to alice, in either event.
    with_docs = alice.send("GET", f"/v1/_changes/notes?since={since}&include_docs=true")
    assert with_docs.status_code == 200, with_docs.text
    assert [event.get("doc") for event in with_docs.json()["events"]] == [None, None]
    assert service.send("PUT", "/v1/notes/back", {"v": 1, "owner": "alice"}).status_code == 201
    live = alice.send("GET", f"/v1/_changes/notes?since={with_docs.json()['next']}&include_docs=true").json()
    assert [(event["id"], event["doc"]) for event in live["events"]] == [("back", {"v": 1, "owner": "alice"})]
    seen_by_bob = bob.send("GET", f"/v1/_changes/notes?since={since}").json()["events"]
    assert [(event["id"], event["matches"]) for event in seen_by_bob] == [("his", True), ("mine", True), ("mine", True)]


def test_a_users_ticket_follows_only_its_documents(people):
    """A browser's ticket (its EventSource sends no Authorization) stands for the user's verified token:
    the feed it opens is the user's own, as the token's would be."""
    alice, bob = people["alice"], people["bob"]
    since = alice.send("GET", "/v1/_changes/notes").json()["next"]
    issued = alice.send("POST", "/v1/_changes/notes/tickets")
    assert issued.status_code == 201, issued.text
    ticket = issued.json()["ticket"]
    assert alice.send("PUT", "/v1/notes/mine", {"v": 1}).status_code == 201
    assert bob.send("PUT", "/v1/notes/his", {"v": 1}).status_code == 201
    by_ticket = requests.get(alice.server.url(f"/v1/_changes/notes?since={since}&ticket={ticket}"), timeout=10)
    assert by_ticket.status_code == 200, by_ticket.text
    assert [event["id"] for event in by_ticket.json()["events"]] == ["mine"]
    assert requests.get(alice.server.url(f"/v1/notes/mine?ticket={ticket}"), timeout=10).status_code == 401


def _batch(caller: Caller, *operations: dict) -> list:
    response = caller.send("POST", "/v1/_batch", {"operations": list(operations)})
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _statuses(results: list) -> list:
    return [result["status"] for result in results]


def test_a_batch_applies_the_rule_to_each_of_its_operations(people):
    """alice's and bob's batches mix gets, puts, patches, deletes and creates on their own and each other's
    documents: each operation is answered as its single request would be, and nothing of the other's is
    read or written (the service sees the other's documents as they were)."""
    alice, bob, service = people["alice"], people["bob"], people["service"]
    for name in ("a1", "a2", "a3", "a4"):
        assert alice.send("PUT", f"/v1/notes/{name}", {"n": name}).status_code == 201
    for name in ("b1", "b2", "b3"):
        assert bob.send("PUT", f"/v1/notes/{name}", {"n": name}).status_code == 201
    bobs = {name: service.send("GET", f"/v1/notes/{name}") for name in ("b1", "b2", "b3")}
    note = {"collection": "notes"}
    answered = _batch(
        alice,
        {"op": "get", **note, "id": "a1"},
        {"op": "get", **note, "id": "b1"},  # bob's: as a missing one
        {"op": "get", **note, "id": "zz"},
        {"op": "put", **note, "id": "a2", "document": {"n": "a2+"}},  # her own: owner filled in
        {"op": "put", **note, "id": "b2", "document": {"n": "666"}},  # bob's: 403
        {"op": "put", **note, "id": "b2", "document": {"n": "666", "owner": "alice"}},  # taken over: 403
        {"op": "put", **note, "id": "new", "document": {"n": "new"}},
        {"op": "put", **note, "id": "given", "document": {"n": "x", "owner": "bob"}},  # given away: 403
        {"op": "patch", **note, "id": "a3", "patch": {"m": 1}},
        {"op": "patch", **note, "id": "b3", "patch": {"n": "666"}},  # bob's: 404
        {"op": "patch", **note, "id": "a4", "patch": {"owner": "bob"}},  # the owner changed: 403
        {"op": "delete", **note, "id": "a4"},  # still hers, as it was: deleted
        {"op": "delete", **note, "id": "b1"},  # bob's: 404
        {"op": "put", **note, "id": "a1", "document": {"n": "a1"}, "if_match": '"stale"'},  # her own condition
        {"op": "put", **note, "id": "a1", "document": {"n": "a1+"}},
        {"op": "patch", **note, "id": "a1", "patch": {"m": 2}},  # what the put above left
        {"op": "create", **note, "document": {"n": "made"}},
        {"op": "create", **note, "document": {"n": "made", "owner": "bob"}},  # 403
    )
    assert _statuses(answered[:9]) == [200, 404, 404, 200, 403, 403, 201, 403, 200]
    assert _statuses(answered[9:]) == [404, 403, 204, 404, 412, 200, 200, 201, 403]
    assert answered[0]["document"] == {"n": "a1", "owner": "alice"}
    assert answered[1]["problem"] == answered[2]["problem"]  # bob's document told as a missing one
    assert answered[3]["document"] == {"n": "a2+", "owner": "alice"}
    assert answered[6]["document"] == {"n": "new", "owner": "alice"}
    assert answered[8]["document"] == {"n": "a3", "owner": "alice", "m": 1}
    assert answered[9]["problem"]["type"] == answered[2]["problem"]["type"]
    assert answered[15]["document"] == {"n": "a1+", "owner": "alice", "m": 2}
    assert answered[16]["document"] == {"n": "made", "owner": "alice"}
    assert "document" not in answered[1] and answered[12] == answered[2]  # nothing of bob's documents told
    for name, before in bobs.items():  # bob's documents as they were
        now = service.send("GET", f"/v1/notes/{name}")
        assert (now.json(), now.headers["ETag"]) == (before.json(), before.headers["ETag"])
    assert service.send("GET", "/v1/notes/given").status_code == 404
    assert service.send("GET", "/v1/notes/a4").status_code == 404

    seen_by_bob = _batch(
        bob,
        {"op": "get", **note, "id": "a1"},
        {"op": "get", **note, "id": "b1"},
        {"op": "put", **note, "id": "a2", "document": {"n": "666"}},
        {"op": "patch", **note, "id": "a3", "patch": {"n": "666"}},
        {"op": "delete", **note, "id": "new"},
        {"op": "delete", **note, "id": "b2"},
        {"op": "create", **note, "document": {"n": "his"}},
    )
    assert _statuses(seen_by_bob) == [404, 200, 403, 404, 404, 204, 201]
    assert seen_by_bob[1]["document"] == {"n": "b1", "owner": "bob"}
    assert seen_by_bob[6]["document"] == {"n": "his", "owner": "bob"}
    assert alice.send("GET", "/v1/notes/a2").json() == {"n": "a2+", "owner": "alice"}
    assert alice.send("GET", "/v1/notes/a3").json() == {"n": "a3", "owner": "alice", "m": 1}
    assert alice.send("GET", "/v1/notes/new").json() == {"n": "new", "owner": "alice"}
    # A service's batch is not bound: it reads and writes anyone's.
    by_service = _batch(service, {"op": "get", **note, "id": "a1"}, {"op": "get", **note, "id": "b1"})
    assert _statuses(by_service) == [200, 200]


# Every operation of the table, and the test that shows what the owner rule does to it.
COVERED = {
    "getDocument": test_a_users_document_is_theirs_and_another_user_sees_it_as_missing,
    "putDocument": test_no_user_writes_over_takes_over_or_gives_away_a_document,
    "patchDocument": test_no_user_writes_over_takes_over_or_gives_away_a_document,
    "deleteDocument": test_no_user_writes_over_takes_over_or_gives_away_a_document,
    "createDocument": test_a_create_by_post_is_its_writers,
    "listDocuments": test_pages_queries_and_multi_gets_hold_only_the_callers_documents,
    "getDocuments": test_pages_queries_and_multi_gets_hold_only_the_callers_documents,
    "runBatch": test_a_batch_applies_the_rule_to_each_of_its_operations,
    "importDocuments": bulk.test_an_import_writes_each_line_as_the_callers_put_would_be,
    "getChanges": test_the_feed_of_a_user_carries_only_its_documents_and_tells_when_one_leaves,
    "createChangesTicket": test_a_users_ticket_follows_only_its_documents,
    # Admin scope only (which the rule never binds), or no document at all.
    "getCollectionSettings": None,
    "putCollectionSettings": None,
    "deleteCollectionSettings": None,
    "listCollectionSettings": None,
    "getHealth": None,
    "getReadiness": None,
    "getMetrics": None,
    "getOpenApi": None,
    "getDocs": None,
    "getDocsAsset": None,
}


def test_every_operation_of_the_table_is_covered():
    assert {operation.operation_id for operation in OPERATIONS} == set(COVERED)
    for operation in OPERATIONS:
        if COVERED[operation.operation_id] is None:
            assert operation.scope in (None, "admin"), operation.operation_id
