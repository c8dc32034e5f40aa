"""``/v1/{coll}/{id}`` over real HTTP: read, replace, merge-patch, delete."""

from __future__ import annotations

import email.utils
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from cache.keys import document_key, index_key_for
from tests.conftest import document_keys

MIB = 1024 * 1024

ODD_BODIES = [
    pytest.param(b'{\n  "z" : 1,\n\t"a":[1, 2 ,3]  ,"m":{}}\n\n', id="odd-whitespace"),
    pytest.param('{"name":"Zoë","emoji":"😀","escaped":"\\u00e9\\n"}'.encode(), id="unicode"),
    pytest.param(b'{"z":1,"y":2,"a":3,"b":{"d":4,"c":5}}', id="key-order"),
    pytest.param(b'{"n":1.50,"big":123456789012345678901234567890,"e":1E+2,"neg":-0}', id="number-spelling"),
    pytest.param(b"{}", id="empty-object"),
]


def key(collection: str, doc_id: str) -> bytes:
    return document_key(collection.encode(), doc_id.encode())


def padded_body(size: int) -> bytes:
    """A valid JSON object of exactly ``size`` bytes."""
    body = b'{"pad":""}'
    return body[:-2] + b"x" * (size - len(body)) + body[-2:]


# --- GET and HEAD -----------------------------------------------------------


@pytest.mark.parametrize("body", ODD_BODIES)
def test_get_returns_the_put_bytes_verbatim(api, body):
    assert api.put_json("/v1/docs/d1", body).status_code == 201
    response = api.get("/v1/docs/d1")
    assert response.status_code == 200
    assert response.content == body
    assert response.headers["Content-Type"] == "application/json"


def test_get_of_missing_document_is_404(api):
    response = api.get("/v1/docs/nothing")
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json"


def test_get_sends_the_strong_etag_stored_at_write_time_on_every_read(api):
    written = api.put_json("/v1/docs/d1", b'{"a":1}')
    etag = written.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
    reads = [api.get("/v1/docs/d1").headers["ETag"] for _ in range(3)]
    assert reads == [etag, etag, etag]


def test_get_sends_last_modified_of_the_write_on_every_read(api):
    before = time.time()
    api.put_json("/v1/docs/d1", b'{"a":1}')
    response = api.get("/v1/docs/d1")
    modified = email.utils.parsedate_to_datetime(response.headers["Last-Modified"]).timestamp()
    assert before - 1 <= modified <= time.time() + 1
    assert response.headers["Last-Modified"].endswith(" GMT")
    time.sleep(1.05 - (time.time() % 1))  # into the next second, so a per-read date would differ
    assert api.get("/v1/docs/d1").headers["Last-Modified"] == response.headers["Last-Modified"]


def test_a_write_in_a_later_second_has_a_later_last_modified(api):
    first = api.put_json("/v1/docs/d1", b'{"a":1}').headers["Last-Modified"]
    time.sleep(1.05 - (time.time() % 1))  # into the next second
    second = api.put_json("/v1/docs/d1", b'{"a":2}').headers["Last-Modified"]
    parse = email.utils.parsedate_to_datetime
    assert parse(second).timestamp() - parse(first).timestamp() >= 1


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("{etag}", id="exact"),
        pytest.param("*", id="star"),
        pytest.param('"nope", {etag} , "other"', id="list"),
        pytest.param("W/{etag}", id="weak"),
    ],
)
def test_get_with_matching_if_none_match_is_304_without_body(api, header):
    etag = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    response = api.get("/v1/docs/d1", headers={"If-None-Match": header.format(etag=etag)})
    assert response.status_code == 304
    assert response.content == b""
    assert response.headers["ETag"] == etag


def test_get_with_stale_if_none_match_is_200_with_the_document(api):
    old = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    api.put_json("/v1/docs/d1", b'{"a":2}')
    response = api.get("/v1/docs/d1", headers={"If-None-Match": old})
    assert response.status_code == 200
    assert response.content == b'{"a":2}'


def test_head_is_get_without_the_body(api):
    body = '{"name": "Zoë"}'.encode()
    etag = api.put_json("/v1/docs/d1", body).headers["ETag"]
    response = api.head("/v1/docs/d1")
    assert response.status_code == 200
    assert response.content == b""
    assert int(response.headers["Content-Length"]) == len(body)
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["ETag"] == etag
    assert "Last-Modified" in response.headers


def test_head_honours_if_none_match_and_404(api):
    etag = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    assert api.head("/v1/docs/d1", headers={"If-None-Match": etag}).status_code == 304
    missing = api.head("/v1/docs/d2")
    assert missing.status_code == 404
    assert missing.content == b""


# --- PUT ----------------------------------------------------------------------


def test_put_creates_with_201_and_replaces_with_200_echoing_the_stored_body(api, redis_client):
    created = api.put_json("/v1/docs/d1", b'{"v": 1}')
    assert created.status_code == 201
    assert created.content == b'{"v": 1}'
    replaced = api.put_json("/v1/docs/d1", b'{"v":  2}')
    assert replaced.status_code == 200
    assert replaced.content == b'{"v":  2}'
    assert replaced.headers["Content-Type"] == "application/json"
    assert api.get("/v1/docs/d1").content == b'{"v":  2}'
    assert redis_client.hget(key("docs", "d1"), "b") == b'{"v":  2}'


def test_put_response_etag_is_the_one_reads_get(api):
    etag = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    assert api.get("/v1/docs/d1").headers["ETag"] == etag


def test_put_changes_the_etag_on_every_write_even_with_identical_bytes(api):
    etags = {api.put_json("/v1/docs/d1", b'{"same":true}').headers["ETag"] for _ in range(5)}
    assert len(etags) == 5


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/json;charset=UTF-8"])
def test_put_accepts_json_with_a_utf8_charset(api, content_type):
    response = api.send("PUT", "/v1/docs/d1", b'{"a":1}', content_type)
    assert response.status_code == 201


def test_put_accepts_a_body_of_exactly_the_size_limit(api):
    body = padded_body(MIB)
    assert len(body) == MIB
    assert api.put_json("/v1/docs/big", body).status_code == 201
    assert api.get("/v1/docs/big").content == body


def test_put_accepts_the_longest_collection_name_and_id(api):
    path = f"/v1/{'c' * 64}/{'i' * 128}"
    assert api.put_json(path, b'{"a":1}').status_code == 201
    assert api.get(path).content == b'{"a":1}'


def test_put_accepts_every_id_character_class(api):
    assert api.put_json("/v1/docs/Az09._~-", b'{"a":1}').status_code == 201
    assert api.get("/v1/docs/Az09._~-").content == b'{"a":1}'


def test_put_with_matching_if_match_replaces(api):
    etag = api.put_json("/v1/docs/d1", b'{"v":1}').headers["ETag"]
    response = api.put_json("/v1/docs/d1", b'{"v":2}', headers={"If-Match": etag})
    assert response.status_code == 200
    assert api.get("/v1/docs/d1").content == b'{"v":2}'


def test_put_with_if_match_list_holding_the_current_etag_replaces(api):
    etag = api.put_json("/v1/docs/d1", b'{"v":1}').headers["ETag"]
    response = api.put_json("/v1/docs/d1", b'{"v":2}', headers={"If-Match": f'"stale", {etag}'})
    assert response.status_code == 200


def test_put_stores_a_deeply_nested_document_verbatim(api):
    body = b'{"a":' + b'{"b":[' * 100 + b"1" + b"]}" * 100 + b"}"
    assert api.put_json("/v1/docs/deep", body).status_code == 201
    assert api.get("/v1/docs/deep").content == body
    assert api.patch_merge("/v1/docs/deep", b'{"c":1}').status_code == 200


def test_put_with_if_match_star_replaces_an_existing_document(api):
    api.put_json("/v1/docs/d1", b'{"v":1}')
    assert api.put_json("/v1/docs/d1", b'{"v":2}', headers={"If-Match": "*"}).status_code == 200


@pytest.mark.parametrize(
    "header", [pytest.param('"stale"', id="other-tag"), pytest.param("W/{etag}", id="weak-never-matches")]
)
def test_put_with_if_match_mismatch_is_412_and_keeps_the_document(api, redis_client, header):
    etag = api.put_json("/v1/docs/d1", b'{"v":1}').headers["ETag"]
    response = api.put_json("/v1/docs/d1", b'{"v":2}', headers={"If-Match": header.format(etag=etag)})
    assert response.status_code == 412
    assert response.headers["Content-Type"] == "application/problem+json"
    current = api.get("/v1/docs/d1")
    assert (current.content, current.headers["ETag"]) == (b'{"v":1}', etag)


@pytest.mark.parametrize("header", ['"anything"', "*"])
def test_put_with_if_match_on_absent_document_is_412_and_creates_nothing(api, redis_client, header):
    response = api.put_json("/v1/docs/d1", b'{"v":1}', headers={"If-Match": header})
    assert response.status_code == 412
    assert document_keys(redis_client) == []


def test_put_with_if_none_match_star_creates_only(api):
    first = api.put_json("/v1/docs/d1", b'{"v":1}', headers={"If-None-Match": "*"})
    assert first.status_code == 201
    second = api.put_json("/v1/docs/d1", b'{"v":2}', headers={"If-None-Match": "*"})
    assert second.status_code == 412
    assert api.get("/v1/docs/d1").content == b'{"v":1}'


def test_put_with_ttl_sets_the_expiry(api, redis_client):
    assert api.put_json("/v1/docs/d1?ttl=100", b'{"a":1}').status_code == 201
    assert 95 <= redis_client.ttl(key("docs", "d1")) <= 100


def test_put_accepts_the_largest_ttl(api, redis_client):
    assert api.put_json("/v1/docs/d1?ttl=31536000", b'{"a":1}').status_code == 201
    assert 31535990 <= redis_client.ttl(key("docs", "d1")) <= 31536000


def test_put_without_ttl_stores_no_expiry(api, redis_client):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    assert redis_client.ttl(key("docs", "d1")) == -1


def test_put_without_ttl_removes_an_earlier_expiry(api, redis_client):
    api.put_json("/v1/docs/d1?ttl=100", b'{"a":1}')
    assert api.put_json("/v1/docs/d1", b'{"a":2}').status_code == 200
    assert redis_client.ttl(key("docs", "d1")) == -1


def test_put_with_ttl_on_replace_sets_the_new_expiry(api, redis_client):
    api.put_json("/v1/docs/d1?ttl=100", b'{"a":1}')
    api.put_json("/v1/docs/d1?ttl=5000", b'{"a":2}')
    assert 4990 <= redis_client.ttl(key("docs", "d1")) <= 5000


def test_expired_document_is_404(api, redis_client):
    api.put_json("/v1/docs/d1?ttl=1", b'{"a":1}')
    redis_client.pexpire(key("docs", "d1"), 1)  # fast-forward the expiry
    time.sleep(0.02)
    assert api.get("/v1/docs/d1").status_code == 404


# --- PATCH --------------------------------------------------------------------


def test_patch_merges_nested_objects_and_null_deletes_and_returns_compact_json(api):
    api.put_json("/v1/docs/d1", b'{"a": 1, "nested": {"x": 1, "y": 2}, "gone": true, "list": [1, 2]}')
    patch = '{"nested": {"y": null, "z": {"deep": "é"}}, "gone": null, "list": [3], "new": "ü"}'.encode()
    response = api.patch_merge("/v1/docs/d1", patch)
    assert response.status_code == 200
    expected = '{"a":1,"nested":{"x":1,"z":{"deep":"é"}},"list":[3],"new":"ü"}'.encode()
    assert response.content == expected
    assert response.headers["Content-Type"] == "application/json"
    assert api.get("/v1/docs/d1").content == expected


def test_patch_removing_a_missing_member_changes_nothing_else(api):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    assert api.patch_merge("/v1/docs/d1", b'{"absent":null}').content == b'{"a":1}'


def test_patch_gives_a_new_etag_that_reads_see(api):
    old = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    new = api.patch_merge("/v1/docs/d1", b'{"b":2}').headers["ETag"]
    assert new != old
    assert api.get("/v1/docs/d1").headers["ETag"] == new


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
def test_patch_needs_merge_patch_content_type_else_415(api, content_type):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    response = api.send("PATCH", "/v1/docs/d1", b'{"a":2}', content_type)
    assert response.status_code == 415
    assert api.get("/v1/docs/d1").content == b'{"a":1}'


def test_patch_of_missing_document_is_404_and_creates_nothing(api, redis_client):
    response = api.patch_merge("/v1/docs/d1", b'{"a":1}')
    assert response.status_code == 404
    assert document_keys(redis_client) == []


def test_patch_with_matching_if_match_applies(api):
    etag = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    response = api.patch_merge("/v1/docs/d1", b'{"b":2}', headers={"If-Match": etag})
    assert response.status_code == 200
    assert response.content == b'{"a":1,"b":2}'


def test_patch_with_if_match_mismatch_is_412_and_changes_nothing(api):
    etag = api.put_json("/v1/docs/d1", b'{"a": 1}').headers["ETag"]
    response = api.patch_merge("/v1/docs/d1", b'{"b":2}', headers={"If-Match": '"stale"'})
    assert response.status_code == 412
    current = api.get("/v1/docs/d1")
    assert (current.content, current.headers["ETag"]) == (b'{"a": 1}', etag)


def test_patch_keeps_the_documents_expiry(api, redis_client):
    api.put_json("/v1/docs/d1?ttl=100", b'{"a":1}')
    api.patch_merge("/v1/docs/d1", b'{"b":2}')
    assert 95 <= redis_client.ttl(key("docs", "d1")) <= 100


def test_patch_that_would_exceed_the_size_limit_is_413_and_changes_nothing(api):
    body = padded_body(MIB - 10)
    api.put_json("/v1/docs/big", body)
    response = api.patch_merge("/v1/docs/big", b'{"more":"0123456789"}')
    assert response.status_code == 413
    assert api.get("/v1/docs/big").content == body


def test_concurrent_patches_lose_no_update(api, jetway):
    """50 PATCHes at once, each from its own connection and adding its own field: all 50 stay."""
    api.put_json("/v1/docs/shared", b"{}")
    writers = 50
    start = threading.Barrier(writers)

    def add_field(n: int) -> int:
        with requests.Session() as session:
            start.wait(10)
            return session.patch(
                jetway.url("/v1/docs/shared"),
                data=json.dumps({f"f{n}": n}),
                headers={"Content-Type": "application/merge-patch+json", **api.auth_header},
                timeout=30,
            ).status_code

    with ThreadPoolExecutor(writers) as pool:
        statuses = list(pool.map(add_field, range(writers)))
    assert statuses == [200] * writers
    assert json.loads(api.get("/v1/docs/shared").content) == {f"f{n}": n for n in range(writers)}


# --- DELETE -------------------------------------------------------------------


def test_delete_is_204_without_body_and_removes_document_and_index_entry(api, redis_client):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    response = api.delete("/v1/docs/d1")
    assert response.status_code == 204
    assert response.content == b""
    assert "Content-Length" not in response.headers
    assert "Content-Type" not in response.headers
    assert api.get("/v1/docs/d1").status_code == 404
    assert redis_client.exists(key("docs", "d1"), index_key_for(b"docs", b"d1")) == 0


def test_delete_of_missing_document_is_404(api):
    response = api.delete("/v1/docs/d1")
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json"


def test_delete_with_if_match_mismatch_is_412_and_keeps_the_document(api):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    assert api.delete("/v1/docs/d1", headers={"If-Match": '"stale"'}).status_code == 412
    assert api.get("/v1/docs/d1").content == b'{"a":1}'


def test_delete_with_matching_if_match_deletes(api):
    etag = api.put_json("/v1/docs/d1", b'{"a":1}').headers["ETag"]
    assert api.delete("/v1/docs/d1", headers={"If-Match": etag}).status_code == 204
    assert api.get("/v1/docs/d1").status_code == 404


def test_patch_with_if_match_of_missing_document_is_412(api, redis_client):
    """RFC 9110: If-Match fails when there is no current representation (as PUT and DELETE)."""
    response = api.patch_merge("/v1/users/ghost", b'{"a":1}', headers={"If-Match": '"x"'})
    assert response.status_code == 412
    assert document_keys(redis_client) == []


def test_writes_work_after_redis_forgets_its_scripts(api, redis_client):
    """After SCRIPT FLUSH (as after a Redis restart) the scripts are loaded again."""
    assert api.put_json("/v1/users/s1", b'{"a":1}').status_code == 201
    redis_client.script_flush()
    assert api.put_json("/v1/users/s1", b'{"a":2}').status_code == 200
    assert api.delete("/v1/users/s1").status_code == 204
