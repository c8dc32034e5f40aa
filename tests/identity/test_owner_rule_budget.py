"""The owner rule and the response byte budget, end to end: another's document counts as a missing one.

A multi-get (``GET /v1/{coll}?ids=``, ``POST /v1/_get/{coll}``) and a
batch's gets count documents against ``JETWAY_MAX_RESPONSE_BYTES``. For a
caller the rule binds, a document it may not see must count as nothing, as
a missing one does: were bob's document counted before being hidden, alice
would learn that it exists, and about how large it is, from a 413 (or a
result over the budget) that a missing id would not get. Here the budget is
small (8 KiB, documents of up to 4 KiB), and each answer about bob's
documents is compared, byte for byte, with the same answer about ids that
do not exist.
"""

from __future__ import annotations

import json
import time
from typing import Dict, Iterator, List, Tuple

import pytest
import requests

from cache import keys
from cache.ownership import owner_rule
from tests.identity import owner_people
from tests.identity.owner_people import Caller
from tests.identity.test_bearer_jwt import issuers_file
from tests.support import JetwayServer

people = owner_people.people  # the fixture, on this module's server

BUDGET = 8192
FILLER = "x" * 3000  # a document of about 3 KB: two fit the budget, three do not
# Headers that differ between any two answers (or say which request it was), whatever they carry.
_PER_ANSWER = {"date", "x-request-id", "server"}


@pytest.fixture(scope="module")
def server(redis_server, oidc_provider, tmp_path_factory) -> Iterator[JetwayServer]:
    """A Jetway whose answers carry at most ``BUDGET`` bytes of documents (``people`` uses it)."""
    directory = tmp_path_factory.mktemp("owner-rule-budget")
    env = {
        "JETWAY_OIDC_ISSUERS": str(issuers_file(directory, oidc_provider.issuer)),
        "JETWAY_MAX_BODY": "4096",
        "JETWAY_MAX_RESPONSE_BYTES": str(BUDGET),
    }
    jetway = JetwayServer(redis_server.url, directory / "jetway.log", env, auth=True).start(["--workers", "1"])
    try:
        yield jetway
    finally:
        jetway.stop()


@pytest.fixture
def stored(people) -> Dict[str, Caller]:
    """bob's large documents big1 and big2, alice's large document mine; warm in the hot cache (a service read)."""
    alice, bob, service = people["alice"], people["bob"], people["service"]
    for name in ("big1", "big2"):
        assert bob.send("PUT", f"/v1/notes/{name}", {"f": FILLER}).status_code == 201
    assert alice.send("PUT", "/v1/notes/mine", {"f": FILLER}).status_code == 201
    for name in ("big1", "big2", "mine"):
        for _ in range(2):
            assert service.send("GET", f"/v1/notes/{name}").status_code == 200
    return people


def answer(response: requests.Response) -> Tuple[int, List[Tuple[str, str]], bytes]:
    """What a client can tell of an answer: its status, its headers but the per-answer ones, its bytes."""
    headers = sorted((name.lower(), value) for name, value in response.headers.items())
    return response.status_code, [(n, v) for n, v in headers if n not in _PER_ANSWER], response.content


@pytest.mark.parametrize(
    "hidden, missing",
    [
        ("big1,big1,big1", "nope,nope,nope"),  # bob's document asked thrice: 9 KB of his
        ("big1,big2,big1", "nope,none,nope"),
        ("mine,big1,big2", "mine,nope,none"),  # alice's own beside two of bob's: hers fits
        ("mine,mine,big1", "mine,mine,nope"),  # hers alone fits, bob's would not have
        ("mine,mine,mine,big1", "mine,mine,mine,nope"),  # hers alone is past the budget: the same 413
    ],
)
def test_a_multi_get_counts_anothers_document_as_a_missing_one(stored, hidden, missing):
    alice = stored["alice"]
    seen = answer(alice.send("GET", f"/v1/notes?ids={hidden}"))
    assert seen == answer(alice.send("GET", f"/v1/notes?ids={missing}"))
    assert seen[0] == (413 if hidden.count("mine") == 3 else 200), seen
    posted = answer(alice.send("POST", "/v1/_get/notes", {"ids": hidden.split(",")}))
    assert posted == answer(alice.send("POST", "/v1/_get/notes", {"ids": missing.split(",")}))
    assert posted[0] == seen[0] and posted[2] == seen[2]  # the POST form's answer is the GET form's


def test_a_multi_get_still_counts_the_callers_own_documents_and_bob_his(stored):
    """The budget still holds for what a caller may see: alice's document thrice is a 413, bob's too for bob."""
    assert stored["alice"].send("GET", "/v1/notes?ids=mine,mine,mine").status_code == 413
    assert stored["bob"].send("GET", "/v1/notes?ids=big1,big2,big1").status_code == 413
    assert stored["bob"].send("GET", "/v1/notes?ids=big1,big2,mine").status_code == 200
    assert stored["service"].send("GET", "/v1/notes?ids=big1,big2,mine").status_code == 413  # not bound


def _batch(caller: Caller, *operations: dict) -> Tuple[int, bytes]:
    response = caller.send("POST", "/v1/_batch", {"operations": list(operations)})
    return response.status_code, response.content


def _gets(*ids: str) -> List[dict]:
    return [{"op": "get", "collection": "notes", "id": doc_id} for doc_id in ids]


@pytest.mark.parametrize(
    "hidden, missing",
    [
        (["big1", "big1", "big1"], ["nope", "nope", "nope"]),
        (["big1", "big2", "big1", "big2"], ["nope", "none", "nope", "none"]),
        (["mine", "big1", "mine"], ["mine", "nope", "mine"]),  # hers twice fits, with bob's it would not
        (["big1", "mine", "big2", "mine", "mine"], ["nope", "mine", "none", "mine", "mine"]),  # the third: 413
    ],
)
def test_a_batchs_gets_count_anothers_document_as_a_missing_one(stored, hidden, missing):
    alice = stored["alice"]
    seen = _batch(alice, *_gets(*hidden))
    assert seen == _batch(alice, *_gets(*missing))
    results = json.loads(seen[1])["results"]
    expected, mine = [], 0
    for doc_id in hidden:  # alice's document fits twice; bob's are 404s, and spend nothing
        mine += doc_id == "mine"
        expected.append(404 if doc_id != "mine" else 200 if mine <= 2 else 413)
    assert [result["status"] for result in results] == expected


def test_a_batchs_gets_read_from_redis_count_anothers_document_as_missing(stored):
    """The same with fresh reads (``Cache-Control: no-cache``): nothing from the hot cache."""
    alice = stored["alice"]
    fresh = {"Cache-Control": "no-cache"}

    def batch(*ids: str) -> Tuple[int, bytes]:
        response = alice.send("POST", "/v1/_batch", {"operations": _gets(*ids)}, **fresh)
        return response.status_code, response.content

    assert batch("big1", "big2", "big1") == batch("nope", "none", "nope")
    assert batch("mine", "big1", "mine") == batch("mine", "nope", "mine")


def test_a_batchs_write_result_is_not_omitted_for_anothers_documents(stored):
    """A put's result carries its document unless the answer's budget is spent: bob's documents spend none."""
    alice = stored["alice"]
    put = {"op": "put", "collection": "notes", "id": "written", "document": {"f": FILLER, "owner": "alice"}}
    status, body = _batch(alice, *_gets("big1", "big2"), put)
    assert status == 200
    results = json.loads(body)["results"]
    assert [result["status"] for result in results[:2]] == [404, 404]
    assert results[2]["status"] in (200, 201) and "document_omitted" not in results[2], results[2]
    assert results[2]["document"] == {"f": FILLER, "owner": "alice"}
    again = _batch(alice, *_gets("nope", "none"), put)
    assert json.loads(again[1])["results"][:2] == results[:2]


def test_while_the_owner_index_is_built_a_bound_read_of_many_is_a_409_not_a_guess(stored, redis_client):
    """A shard building the rule's index (the rule just declared over documents already there) cannot tell
    whose its documents are: alice's multi-get and batch get of an id there answer 409 ``index-building``, as
    her page would, never a document or a budget judged by a stale entry; once built, they answer again."""
    alice, service = stored["alice"], stored["service"]
    states = keys.index_states_key(b"notes", keys.shard_of(b"mine"))
    field = owner_rule(owner_people.SETTINGS["owner"]).index_state
    assert redis_client.hget(states, field) == b"1"
    redis_client.hset(states, field, b"0")  # building, from its first id
    try:
        for response in (
            alice.send("GET", "/v1/notes?ids=mine"),
            alice.send("POST", "/v1/_get/notes", {"ids": ["mine"]}),
        ):
            assert response.status_code == 409 and response.json()["type"].endswith("index-building"), response.text
            assert response.headers["Retry-After"]
        fresh = alice.send("POST", "/v1/_batch", {"operations": _gets("mine")}, **{"Cache-Control": "no-cache"})
        assert fresh.json()["results"][0]["status"] == 409
        assert service.send("GET", "/v1/notes?ids=mine").status_code == 200  # not bound: no index needed
    finally:
        redis_client.hset(states, field, b"1")
    assert alice.send("GET", "/v1/notes?ids=mine").json()["items"] == [{"f": FILLER, "owner": "alice"}]


def test_a_caller_the_rule_binds_to_no_owner_reads_nothing_of_many(people):
    """A rule whose claim alice's token lacks binds her to no owner: her multi-gets and batch gets find
    nothing, not even a document whose owner member is the empty string (which the index lists too)."""
    alice, service = people["alice"], people["service"]
    assert service.send("PUT", "/v1/notes/blank", {"owner": ""}).status_code == 201
    assert service.send("PUT", "/v1/notes/hers", {"owner": "alice"}).status_code == 201
    rule = {"owner": {"pointer": "/owner", "claim": "employee_id"}}  # same pointer: the same index
    assert service.send("PUT", "/v1/_collections/notes", rule).status_code == 200
    time.sleep(0.2)  # the settings change reaches the worker's settings cache (a message)
    seen = answer(alice.send("GET", "/v1/notes?ids=blank,hers"))
    assert seen == answer(alice.send("GET", "/v1/notes?ids=nope,none"))
    assert seen[0] == 200 and json.loads(seen[2]) == {"items": [None, None]}
    fresh = {"Cache-Control": "no-cache"}
    results = alice.send("POST", "/v1/_batch", {"operations": _gets("blank", "hers")}, **fresh).json()["results"]
    assert [result["status"] for result in results] == [404, 404]
