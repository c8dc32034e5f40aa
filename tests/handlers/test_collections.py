"""``/v1/{coll}`` over real HTTP: create with a ULID, list pages, get many."""

from __future__ import annotations

import json
import re
import time
from typing import List, Optional, Tuple

import pytest

from cache.keys import document_key, index_key_for
from tests.support import wait_until

ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}\Z")


def doc(doc_id: str) -> bytes:
    """A body that names its id, with odd spacing that must survive verbatim."""
    return f'{{ "id" :"{doc_id}",\n "n": 1.0 }}'.encode()


def put_all(api, collection: str, ids: List[str]) -> None:
    for doc_id in ids:
        assert api.put_json(f"/v1/{collection}/{doc_id}", doc(doc_id)).status_code == 201


def page(api, collection: str, limit: Optional[int] = None, cursor: Optional[str] = None) -> Tuple[List[str], str]:
    """One page: the ids of its items and its ``next``."""
    params = {name: value for name, value in (("limit", limit), ("cursor", cursor)) if value is not None}
    response = api.get(f"/v1/{collection}", params=params)
    assert response.status_code == 200, response.content
    listing = json.loads(response.content)
    return [item["id"] for item in listing["items"]], listing["next"]


def walk(api, collection: str, limit: int) -> List[List[str]]:
    pages, cursor = [], None
    while True:
        ids, cursor = page(api, collection, limit, cursor)
        pages.append(ids)
        if cursor is None:
            return pages


# --- POST ---------------------------------------------------------------------


def test_post_creates_a_ulid_document_with_location_and_the_stored_body(api):
    body = '{ "name":"Zoë",\n"z":1, "a":2 }'.encode()
    response = api.post_json("/v1/orders", body)
    assert response.status_code == 201
    assert response.content == body
    assert response.headers["Content-Type"] == "application/json"
    location = response.headers["Location"]
    collection, doc_id = re.fullmatch(r"/v1/([^/]+)/([^/]+)", location).groups()
    assert collection == "orders"
    assert ULID.match(doc_id)
    read = api.get(location)
    assert read.status_code == 200
    assert read.content == body
    assert read.headers["ETag"] == response.headers["ETag"]


def test_post_ids_made_in_sequence_sort_in_creation_order(api):
    ids = [api.post_json("/v1/orders", b'{"n":%d}' % n).headers["Location"].rsplit("/", 1)[1] for n in range(30)]
    assert len(set(ids)) == 30
    assert sorted(ids) == ids


def test_post_with_ttl_sets_the_expiry(api, redis_client):
    location = api.post_json("/v1/orders?ttl=100", b"{}").headers["Location"]
    doc_id = location.rsplit("/", 1)[1].encode()
    assert 95 <= redis_client.ttl(document_key(b"orders", doc_id)) <= 100


def test_post_without_ttl_stores_no_expiry(api, redis_client):
    doc_id = api.post_json("/v1/orders", b"{}").headers["Location"].rsplit("/", 1)[1].encode()
    assert redis_client.ttl(document_key(b"orders", doc_id)) == -1


def test_post_accepts_a_trailing_slash(api):
    response = api.post_json("/v1/orders/", b"{}")
    assert response.status_code == 201
    assert api.get(response.headers["Location"]).status_code == 200


# --- list ---------------------------------------------------------------------


def test_list_of_empty_collection_is_empty_with_no_next(api):
    response = api.get("/v1/nothing")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert json.loads(response.content) == {"items": [], "next": None}


def test_list_is_in_byte_order_of_ids(api):
    ids = ["b", "a", "B", "Z", "_x", "~z", "0", "-", "a.b", "a-b", "aa", "A~"]
    put_all(api, "things", ids)
    listed, following = page(api, "things")
    assert listed == sorted(ids, key=str.encode)
    assert following is None


def test_list_bodies_are_the_stored_bytes_verbatim(api):
    bodies = {"a": b'{"z":1,  "a" : 2}', "b": '{"é":"ü"}\n'.encode(), "c": b"  {\n}\t"}
    for doc_id, body in bodies.items():
        api.put_json(f"/v1/raw/{doc_id}", body)
    response = api.get("/v1/raw")
    assert b"[" + b",".join(bodies.values()) + b"]" in response.content
    assert len(json.loads(response.content)["items"]) == 3


def test_list_default_limit_is_100(api):
    ids = [f"d{n:03d}" for n in range(101)]
    put_all(api, "many", ids)
    listed, following = page(api, "many")
    assert listed == ids[:100]
    assert following is not None
    assert page(api, "many", cursor=following) == (ids[100:], None)


def test_list_accepts_limit_1_and_1000(api):
    put_all(api, "few", ["a", "b"])
    assert page(api, "few", limit=1)[0] == ["a"]
    assert page(api, "few", limit=1000) == (["a", "b"], None)


def test_walking_all_pages_returns_every_document_once_in_order(api):
    ids = [f"doc-{n:02d}" for n in range(30)]
    put_all(api, "walk", ids[::-1])
    pages = walk(api, "walk", 7)
    assert [len(p) for p in pages] == [7, 7, 7, 7, 2]
    assert [doc_id for p in pages for doc_id in p] == ids


def test_a_full_last_page_has_no_next(api):
    put_all(api, "exact", ["a", "b", "c", "d"])
    assert page(api, "exact", limit=4) == (["a", "b", "c", "d"], None)
    assert walk(api, "exact", 2) == [["a", "b"], ["c", "d"]]


def test_document_rewritten_between_pages_is_not_listed_twice(api):
    ids = list("abcdefghij")
    put_all(api, "moving", ids)
    first, cursor = page(api, "moving", 5)
    assert api.put_json("/v1/moving/b", b'{"id":"b","v":2}').status_code == 200
    second, cursor = page(api, "moving", 5, cursor)
    assert first + second == ids
    assert cursor is None


def test_document_created_beyond_the_cursor_appears_on_a_later_page(api):
    put_all(api, "growing", ["a", "c", "e", "g"])
    first, cursor = page(api, "growing", 2)
    put_all(api, "growing", ["f", "b"])  # f is ahead of the cursor, b behind it
    second, cursor = page(api, "growing", 2, cursor)
    third, cursor = page(api, "growing", 2, cursor)
    assert (first, second, third, cursor) == (["a", "c"], ["e", "f"], ["g"], None)


def test_deleting_the_cursor_document_does_not_break_the_cursor(api):
    put_all(api, "shrinking", list("abcdef"))
    first, cursor = page(api, "shrinking", 3)
    assert api.delete("/v1/shrinking/c").status_code == 204
    assert page(api, "shrinking", 3, cursor) == (["d", "e", "f"], None)
    assert first == ["a", "b", "c"]


def test_lists_do_not_mix_collections(api):
    put_all(api, "left", ["a", "b"])
    put_all(api, "right", ["c"])
    assert page(api, "left") == (["a", "b"], None)
    assert page(api, "right") == (["c"], None)


def test_expired_documents_are_not_listed_and_their_index_entries_are_dropped(api, redis_client):
    put_all(api, "ttl", ["a", "c"])
    assert api.put_json("/v1/ttl/b?ttl=1", doc("b")).status_code == 201
    redis_client.pexpire(document_key(b"ttl", b"b"), 1)  # fast-forward the expiry
    time.sleep(0.02)
    assert page(api, "ttl") == (["a", "c"], None)
    wait_until(lambda: redis_client.zscore(index_key_for(b"ttl", b"b"), "b") is None, 5, "the stale entry to go")


def test_head_on_a_list_is_get_without_the_body(api):
    put_all(api, "heads", ["a", "b"])
    got = api.get("/v1/heads")
    response = api.head("/v1/heads")
    assert response.status_code == 200
    assert response.content == b""
    assert int(response.headers["Content-Length"]) == len(got.content)


# --- ids= ---------------------------------------------------------------------


def test_get_many_returns_asked_order_with_null_for_missing(api):
    put_all(api, "many", ["a", "b", "c"])
    response = api.get("/v1/many?ids=c,zz,a,c")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert b"[" + b",".join([doc("c"), b"null", doc("a"), doc("c")]) + b"]" in response.content
    assert json.loads(response.content) == {
        "items": [json.loads(doc("c")), None, json.loads(doc("a")), json.loads(doc("c"))]
    }


def test_get_many_of_only_missing_ids_is_all_null(api):
    assert json.loads(api.get("/v1/many?ids=x,y").content) == {"items": [None, None]}


def test_get_many_shows_an_expired_document_as_null(api, redis_client):
    put_all(api, "many", ["a"])
    api.put_json("/v1/many/b?ttl=1", doc("b"))
    redis_client.pexpire(document_key(b"many", b"b"), 1)
    time.sleep(0.02)
    assert json.loads(api.get("/v1/many?ids=a,b").content)["items"] == [json.loads(doc("a")), None]


@pytest.mark.parametrize("count", [1, 1000])
def test_get_many_accepts_one_to_1000_ids(api, count):
    put_all(api, "many", ["a"])
    items = json.loads(api.get("/v1/many", params={"ids": ",".join(["a"] * count)}).content)["items"]
    assert len(items) == count


@pytest.mark.parametrize("query", ["ids=c&ids=zz&ids=a&ids=c", "ids=c,zz&ids=a,c", "ids=c&ids=zz,a&ids=c"])
def test_get_many_takes_repeated_ids_as_one_list(api, query):
    """``ids=a&ids=b`` is what most generated clients send for an array."""
    put_all(api, "many", ["a", "c"])
    expected = api.get("/v1/many?ids=c,zz,a,c")
    response = api.get(f"/v1/many?{query}")
    assert response.status_code == 200
    assert response.content == expected.content


@pytest.mark.parametrize("limit", [2, 100, 1000])
def test_get_many_ignores_a_limit_that_would_not_cut_it(api, limit):
    put_all(api, "many", ["a", "b"])
    response = api.get(f"/v1/many?ids=b,a&limit={limit}")
    assert response.status_code == 200
    assert json.loads(response.content) == {"items": [json.loads(doc("b")), json.loads(doc("a"))]}


def test_get_many_counts_repeated_ids_towards_the_limit_of_1000(api):
    put_all(api, "many", ["a"])
    query = "ids=" + ",".join(["a"] * 600) + "&ids=" + ",".join(["a"] * 400)
    assert len(json.loads(api.get(f"/v1/many?{query}").content)["items"]) == 1000
