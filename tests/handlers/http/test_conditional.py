"""handlers.http.conditional: If-Modified-Since and If-Unmodified-Since from the stored Last-Modified."""

import email.utils
import time

import pytest

from handlers.http.conditional import http_date

NOV_6_1994 = 784111777


@pytest.mark.parametrize(
    "text",
    ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"],
)
def test_the_three_http_date_forms_are_read(text):
    assert http_date(text) == NOV_6_1994


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "yesterday",
        "Sun, 06 Nov 1994 08:49:37 +0100",  # not GMT
        "Sun, 06 Nov 1994 08:49:37 GMT, Mon, 07 Nov 1994 08:49:37 GMT",  # a list
        "Sun, 31 Feb 1994 08:49:37 GMT",  # no such day
        "06 Nov 1994 08:49:37 GMT",
    ],
)
def test_anything_else_is_not_a_date(text):
    assert http_date(text) is None


def http_time(seconds: float) -> str:
    return email.utils.formatdate(seconds, usegmt=True)


@pytest.fixture
def written(api):
    """``docs/d1``, and its Last-Modified in seconds."""
    response = api.put_json("/v1/docs/d1", b'{"a":1}')
    return api, email.utils.parsedate_to_datetime(response.headers["Last-Modified"]).timestamp()


def test_if_modified_since_answers_304_when_not_modified(written):
    api, modified = written
    for since in (modified, modified + 3600):
        response = api.get("/v1/docs/d1", headers={"If-Modified-Since": http_time(since)})
        assert response.status_code == 304 and response.content == b""
        assert response.headers["ETag"] and response.headers["Cache-Control"] == "no-cache"
    head = api.head("/v1/docs/d1", headers={"If-Modified-Since": http_time(modified)})
    assert head.status_code == 304


def test_if_modified_since_before_the_write_or_malformed_gets_the_document(written):
    api, modified = written
    for since in (http_time(modified - 1), "not a date", http_time(modified) + ", " + http_time(modified)):
        response = api.get("/v1/docs/d1", headers={"If-Modified-Since": since})
        assert response.status_code == 200 and response.content == b'{"a":1}'


def test_if_none_match_wins_over_if_modified_since(written):
    api, modified = written
    headers = {"If-None-Match": '"other"', "If-Modified-Since": http_time(modified + 60)}
    assert api.get("/v1/docs/d1", headers=headers).status_code == 200


def test_if_unmodified_since_refuses_a_write_to_a_document_changed_after_it(written):
    api, modified = written
    stale = {"If-Unmodified-Since": http_time(modified - 10)}
    assert api.put_json("/v1/docs/d1", b'{"a":2}', headers=stale).status_code == 412
    assert api.patch_merge("/v1/docs/d1", b'{"a":2}', headers=stale).status_code == 412
    assert api.delete("/v1/docs/d1", headers=stale).status_code == 412
    assert api.get("/v1/docs/d1").content == b'{"a":1}'


def test_if_unmodified_since_lets_a_write_through_when_the_document_is_not_newer(written):
    api, modified = written
    fresh = {"If-Unmodified-Since": http_time(modified)}
    assert api.put_json("/v1/docs/d1", b'{"a":2}', headers=fresh).status_code == 200
    modified = email.utils.parsedate_to_datetime(api.get("/v1/docs/d1").headers["Last-Modified"]).timestamp()
    fresh = {"If-Unmodified-Since": http_time(modified + 5)}
    assert api.patch_merge("/v1/docs/d1", b'{"b":3}', headers=fresh).status_code == 200
    assert api.get("/v1/docs/d1").json() == {"a": 2, "b": 3}
    assert api.delete("/v1/docs/d1", headers=fresh).status_code == 204


def test_if_unmodified_since_is_ignored_beside_if_match_and_for_a_missing_document(written):
    api, modified = written
    etag = api.get("/v1/docs/d1").headers["ETag"]
    headers = {"If-Match": etag, "If-Unmodified-Since": http_time(modified - 10)}
    assert api.put_json("/v1/docs/d1", b'{"a":3}', headers=headers).status_code == 200
    old = {"If-Unmodified-Since": http_time(time.time() - 3600)}
    assert api.put_json("/v1/docs/new", b'{"n":1}', headers=old).status_code == 201
    assert api.delete("/v1/docs/gone", headers=old).status_code == 404
    assert api.patch_merge("/v1/docs/gone", b"{}", headers=old).status_code == 404


def test_if_modified_since_means_nothing_to_a_write(written):
    api, modified = written
    headers = {"If-Modified-Since": http_time(modified + 60)}
    assert api.put_json("/v1/docs/d1", b'{"a":4}', headers=headers).status_code == 200
