"""``POST /v1/_get/{coll}``: the GET form's answer, for id lists no request line holds.

Part of the API tests: ``make test-cluster`` runs it on a 3-master cluster
and on Sentinel too.
"""

from __future__ import annotations

import json
from typing import List

import pytest

from tests.conftest import JSON

MAX_IDS = 1000


def long_ids(count: int) -> List[str]:
    """Ids of the longest allowed kind (128 characters), spread over every shard and slot."""
    return [f"{n:06d}" + "x" * 122 for n in range(count)]


def post_ids(api, collection: str, ids: List[object]):
    return api.post_json(f"/v1/_get/{collection}", json.dumps({"ids": ids}).encode())


def test_the_answer_is_the_get_forms_byte_for_byte(api):
    for doc_id, body in (("a", b'{"n": 1}'), ("b", b'{"s":"\\u00e9"}')):
        assert api.put_json(f"/v1/things/{doc_id}", body).status_code == 201
    ids = ["b", "missing", "a", "b"]
    by_get = api.get("/v1/things?ids=" + ",".join(ids))
    by_post = post_ids(api, "things", ids)
    assert by_post.status_code == 200 and by_post.headers["Content-Type"] == JSON
    assert by_post.content == by_get.content == b'{"items":[{"s":"\\u00e9"},null,{"n": 1},{"s":"\\u00e9"}]}'


def test_a_thousand_of_the_longest_ids_fit_in_a_body_and_not_in_a_url(api):
    ids = long_ids(MAX_IDS)
    for doc_id in ids[::100]:
        assert api.put_json(f"/v1/many/{doc_id}", b'{"id":"%s"}' % doc_id.encode()).status_code == 201
    response = post_ids(api, "many", ids)
    assert response.status_code == 200
    items = response.json()["items"]
    assert len(items) == MAX_IDS
    assert [item["id"] for item in items[::100]] == ids[::100]
    assert sum(item is not None for item in items) == MAX_IDS // 100
    assert api.get("/v1/many?ids=" + ",".join(ids)).status_code == 414


def test_no_ids_is_an_empty_list(api):
    response = post_ids(api, "things", [])
    assert (response.status_code, response.content) == (200, b'{"items":[]}')


@pytest.mark.parametrize(
    ("body", "problem", "detail"),
    [
        (json.dumps({"ids": ["a"] * (MAX_IDS + 1)}).encode(), "invalid-ids", f"at most {MAX_IDS} ids"),
        (b'{"ids":["ok","no/slash"]}', "invalid-id", "'no/slash'"),
        (b'{"ids":["ok",7]}', "invalid-id", "not 7"),
        (b'{"ids":"a,b"}', "invalid-ids", '{"ids": [...]}'),
        (b'{"ids":["a"],"limit":1}', "invalid-ids", "no other member"),
        (b'["a"]', "not-an-object", "object"),
        (b'{"ids":["a"],"ids":["b"]}', "malformed-json", "duplicate member name 'ids'"),
    ],
)
def test_a_bad_body_is_a_400_that_says_why(api, body, problem, detail):
    response = api.post_json("/v1/_get/things", body)
    assert response.status_code == 400
    assert response.json()["type"].endswith(":" + problem)
    assert detail in response.json()["detail"]


def test_media_type_collection_and_method_are_checked(api):
    assert api.send("POST", "/v1/_get/things", b'{"ids":[]}', "text/plain").status_code == 415
    assert post_ids(api, "Bad-Name", []).status_code == 400
    response = api.get("/v1/_get/things")
    assert response.status_code == 405 and response.headers["Allow"] == "POST, OPTIONS"


def test_read_scope_is_enough_and_write_scope_is_not(api, jetway):
    assert api.put_json("/v1/things/a", b'{"a":1}').status_code == 201
    body = json.dumps({"ids": ["a"]}).encode()
    for scopes, status in ((("read:things",), 200), (("write:things",), 403), (("read:other",), 403)):
        token = jetway.make_token("multi-get-" + scopes[0].replace(":", "-"), *scopes)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": JSON}
        response = api.session.post(jetway.url("/v1/_get/things"), data=body, headers=headers, timeout=10)
        assert response.status_code == status, scopes
