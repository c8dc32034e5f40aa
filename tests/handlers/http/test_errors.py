"""Errors over real HTTP: problem+json, the right 4xx, and Redis left untouched."""

from __future__ import annotations

import http
import json
from typing import Dict, Tuple

import pytest
import redis

from cache import keys
from tests.conftest import MERGE_PATCH

MIB = 1024 * 1024
SEED = b'{"seed": true}'


def assert_problem(response, status: int) -> dict:
    """An RFC 9457 problem with ``status``; returns its members."""
    assert response.status_code == status, response.content
    assert response.headers["Content-Type"] == "application/problem+json"
    problem = json.loads(response.content)
    assert problem["status"] == status
    assert problem["title"] == http.HTTPStatus(status).phrase
    assert isinstance(problem["type"], str) and problem["type"]
    assert isinstance(problem["detail"], str) and problem["detail"]
    return problem


def snapshot(client: redis.Redis) -> Dict[bytes, Tuple[bytes, int]]:
    """Every key with its serialized value and expiry.

    SCAN, not KEYS: on a cluster client it covers every node. PEXPIRETIME,
    not TTL: an absolute time does not tick down while the test runs.
    """
    return {name: (client.dump(name), client.pexpiretime(name)) for name in client.scan_iter() if not _sweeping(name)}


def _sweeping(name: bytes) -> bool:
    """The expiry sweepers' registry and lease (cache/documents/expiry.py): no request's doing, renewed as they run."""
    return name == keys.EXPIRING or name.endswith(b":xl:~expiry:")


@pytest.fixture
def seeded(api, redis_client):
    """One document at /v1/docs/d1; yields the Redis state to compare against."""
    assert api.put_json("/v1/docs/d1?ttl=1000", SEED).status_code == 201
    before = snapshot(redis_client)
    assert before
    yield before
    assert snapshot(redis_client) == before, "a rejected request changed Redis"


# --- routes and methods -------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/nope", "/v1", "/v1/", "/v2/docs/d1", "/v1/docs/d1/extra"])
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_route_is_404_problem(api, path, method):
    problem = assert_problem(api.request(method, path), 404)
    assert path in problem["detail"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/v1/docs/d1", {"GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"}),
        ("DELETE", "/v1/docs", {"GET", "HEAD", "POST", "OPTIONS"}),
        ("PUT", "/v1/docs", {"GET", "HEAD", "POST", "OPTIONS"}),
        ("PATCH", "/v1/docs", {"GET", "HEAD", "POST", "OPTIONS"}),
    ],
)
def test_unsupported_method_is_405_with_allow(api, seeded, method, path, allowed):
    response = api.send(method, path, b'{"a":1}')
    assert_problem(response, 405)
    assert {name.strip() for name in response.headers["Allow"].split(",")} == allowed


# --- bodies -------------------------------------------------------------------

BAD_BODIES = [
    pytest.param(b'{"a":', id="truncated"),
    pytest.param(b"", id="empty"),
    pytest.param(b"   ", id="blank"),
    pytest.param(b"{'a': 1}", id="single-quotes"),
    pytest.param(b'{"a":1} {"b":2}', id="two-values"),
    pytest.param(b'{"a":1,}', id="trailing-comma"),
    pytest.param(b"[1, 2]", id="array"),
    pytest.param(b'"text"', id="string"),
    pytest.param(b"42", id="number"),
    pytest.param(b"null", id="null"),
    pytest.param(b"true", id="true"),
    pytest.param(b'{"a":"\xff\xfe"}', id="invalid-utf8"),
    pytest.param(b'{"a":"\xed\xa0\x80"}', id="utf8-encoded-surrogate"),
    pytest.param('{"a":"é"}'.encode("latin-1"), id="latin-1"),
    pytest.param(b'{"a":NaN}', id="NaN"),
    pytest.param(b'{"a":Infinity}', id="Infinity"),
    pytest.param(b'{"a":-Infinity}', id="minus-Infinity"),
    pytest.param(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="nested-too-deep"),
    # I-JSON (RFC 7493): parsers disagree on which of two equal names wins.
    pytest.param(b'{"a":1,"a":2}', id="duplicate-name"),
    pytest.param(b'{"b":{"a":1,"\\u0061":2}}', id="duplicate-name-escaped"),
    pytest.param(b'{"a":"\\ud800"}', id="lone-surrogate"),
    pytest.param(b'{"\\udc00":1}', id="lone-surrogate-in-name"),
]


@pytest.mark.parametrize("body", BAD_BODIES)
@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/docs/d1"), ("PUT", "/v1/docs/d2"), ("POST", "/v1/docs")])
def test_malformed_or_non_object_body_is_400_and_changes_nothing(api, seeded, method, path, body):
    assert_problem(api.send(method, path, body), 400)


@pytest.mark.parametrize("body", BAD_BODIES)
def test_malformed_or_non_object_merge_patch_is_400_and_changes_nothing(api, seeded, body):
    assert_problem(api.patch_merge("/v1/docs/d1", body), 400)


def test_body_over_the_limit_is_413_and_changes_nothing(api, seeded):
    body = b'{"pad":"' + b"x" * (MIB + 1 - 10) + b'"}'
    assert len(body) == MIB + 1
    assert_problem(api.put_json("/v1/docs/d1", body), 413)
    assert_problem(api.put_json("/v1/docs/d2", body), 413)
    assert_problem(api.post_json("/v1/docs", body), 413)
    assert_problem(api.patch_merge("/v1/docs/d1", body), 413)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/merge-patch+json",
        "application/json; charset=latin-1",
        "application/json; profile=x",
        "application/jsonx",
    ],
)
@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/docs/d1"), ("PUT", "/v1/docs/d2"), ("POST", "/v1/docs")])
def test_body_not_labelled_application_json_is_415_and_changes_nothing(api, seeded, method, path, content_type):
    assert_problem(api.send(method, path, b'{"a":1}', content_type), 415)


@pytest.mark.parametrize("content_type", [None, "application/json", "application/merge-patch+json; charset=latin-1"])
def test_patch_not_labelled_merge_patch_is_415_and_changes_nothing(api, seeded, content_type):
    assert_problem(api.send("PATCH", "/v1/docs/d1", b'{"a":1}', content_type), 415)


def test_merge_patch_with_a_utf8_charset_is_accepted(api):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    response = api.send("PATCH", "/v1/docs/d1", b'{"b":2}', MERGE_PATCH + "; charset=utf-8")
    assert response.status_code == 200


# --- names and ids ------------------------------------------------------------

BAD_COLLECTIONS = ["Docs", "1docs", "-docs", "_bulk", "d" * 65, "do%20cs", "d%C3%A9", "do.cs", "do~cs", "%7Bx%7D"]
BAD_IDS = ["i" * 129, "a%2Fb", "a%20b", "a+b", "a*b", "a:b", "%7Bx%7D", "%FF", "%C3%A9", "%2E", "%2E%2E"]


def _document_requests(path: str):
    return [("GET", path), ("HEAD", path), ("PUT", path), ("PATCH", path), ("DELETE", path)]


@pytest.mark.parametrize("collection", BAD_COLLECTIONS)
def test_bad_collection_name_is_400_and_changes_nothing(api, seeded, collection):
    for method, path in [*_document_requests(f"/v1/{collection}/d1"), ("GET", f"/v1/{collection}")]:
        content_type = MERGE_PATCH if method == "PATCH" else "application/json"
        response = api.send(method, path, b'{"a":1}', content_type)
        assert response.status_code == 400, (method, path)
        if method != "HEAD":
            assert_problem(response, 400)
    assert_problem(api.post_json(f"/v1/{collection}", b'{"a":1}'), 400)


@pytest.mark.parametrize("doc_id", BAD_IDS)
def test_bad_document_id_is_400_and_changes_nothing(api, seeded, doc_id):
    for method, path in _document_requests(f"/v1/docs/{doc_id}"):
        content_type = MERGE_PATCH if method == "PATCH" else "application/json"
        response = api.send(method, path, b'{"a":1}', content_type)
        assert response.status_code == 400, (method, path)
        if method != "HEAD":
            assert_problem(response, 400)


@pytest.mark.parametrize("doc_id", [".", ".."])
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_dot_ids_sent_raw_are_400_and_change_nothing(api, seeded, method, doc_id):
    """``.`` and ``..`` in the request line as sent, not resolved away by a client."""
    response = api.raw(method, f"/v1/docs/{doc_id}", b'{"a":1}', {"Content-Type": "application/json"})
    assert response.status == 400
    assert response.headers["Content-Type"] == "application/problem+json"
    assert "invalid-id" in json.loads(response.body)["type"]


# --- query parameters ---------------------------------------------------------

BAD_TTLS = ["0", "abc", "31536001", "-1", "1.5", "", "1e3", "+5", " 5", "%D9%A3", "99999999999999999999"]


@pytest.mark.parametrize("ttl", BAD_TTLS)
@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/docs/d1"), ("PUT", "/v1/docs/d2"), ("POST", "/v1/docs")])
def test_bad_ttl_is_400_and_changes_nothing(api, seeded, method, path, ttl):
    problem = assert_problem(api.send(method, f"{path}?ttl={ttl}", b'{"a":1}'), 400)
    assert "ttl" in problem["detail"]


def test_ttl_given_twice_is_400(api, seeded):
    assert_problem(api.put_json("/v1/docs/d2?ttl=5&ttl=6", b'{"a":1}'), 400)


@pytest.mark.parametrize("limit", ["0", "1001", "abc", "-1", "", "2.0", "%D9%A3"])
def test_bad_limit_is_400(api, seeded, limit):
    problem = assert_problem(api.get(f"/v1/docs?limit={limit}"), 400)
    assert "limit" in problem["detail"]


@pytest.mark.parametrize("cursor", ["garbage", "", "!!!!", "Lg", "Li4", "%FF", "e30"])
def test_bad_cursor_is_400(api, seeded, cursor):
    """Cursors that are not base64url of a valid id ("Lg" is ".", "Li4" is "..", "e30" is "{}")."""
    problem = assert_problem(api.get(f"/v1/docs?cursor={cursor}"), 400)
    assert "cursor" in problem["detail"]


@pytest.mark.parametrize(
    "query",
    [
        "ids=",
        "ids=a,,b",
        "ids=a,..",
        "ids=a,b%2Fc",
        "ids=" + "i" * 129,
        "ids=" + ",".join(["a"] * 1001),
        "ids=a,b&limit=1",
        "ids=a&ids=b&limit=1",
        "ids=a&limit=0",
        "ids=a&limit=x",
        "ids=a&limit=1&limit=2",
        "ids=a&cursor=YQ",
        "ids=a&ids=",
        "ids=a&ids=..",
        "ids=" + ",".join(["a"] * 600) + "&ids=" + ",".join(["a"] * 401),
    ],
)
def test_bad_ids_query_is_400(api, seeded, query):
    assert_problem(api.get(f"/v1/docs?{query}"), 400)


# --- conditions and missing documents -----------------------------------------


def test_missing_document_errors_are_404_problems(api, seeded):
    assert_problem(api.get("/v1/docs/none"), 404)
    assert_problem(api.delete("/v1/docs/none"), 404)
    assert_problem(api.patch_merge("/v1/docs/none", b'{"a":1}'), 404)


def test_failed_preconditions_are_412_problems_and_change_nothing(api, seeded):
    stale = {"If-Match": '"stale"'}
    assert_problem(api.put_json("/v1/docs/d1", b'{"a":1}', headers=stale), 412)
    assert_problem(api.put_json("/v1/docs/d1", b'{"a":1}', headers={"If-None-Match": "*"}), 412)
    assert_problem(api.patch_merge("/v1/docs/d1", b'{"a":1}', headers=stale), 412)
    assert_problem(api.delete("/v1/docs/d1", headers=stale), 412)


def test_a_repeated_name_is_named_in_the_problem_and_a_surrogate_pair_is_stored(api, redis_client):
    response = api.put_json("/v1/docs/d1", b'{"x":{"k":1,"k":2}}')
    assert_problem(response, 400)
    assert response.json()["detail"] == "duplicate member name 'k'"
    assert api.put_json("/v1/docs/smile", b'{"a":"\\ud83d\\ude00"}').status_code == 201
    assert api.get("/v1/docs/smile").json() == {"a": "\U0001f600"}
