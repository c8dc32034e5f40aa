"""CORS in a real browser: a page on another origin uses the API with ``fetch`` and a bearer token.

Jetway here allows the page server's origin (``JETWAY_CORS_ORIGINS``),
authorizes every ``/v1`` request and writes its access log, so a test can
say what the server did (a preflight, a 304) as well as what the page saw.
Every ``fetch`` sends ``Authorization``, so Chromium preflights it; what a
page reads is only what the CORS headers let it read.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, Iterator, List

import pytest
import requests

from cache.documents.variants import CODINGS
from tests.browser import Browser, Fetched
from tests.support import JetwayServer, wait_until

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>a front end</title></head>
<body><p>a page on another origin than Jetway's</p></body></html>
"""
DOCUMENT = b'{"name":"Ada","tags":["math","engines"],"score":97.5}'
# Over JETWAY_COMPRESS_MIN_BYTES (1024): stored with its gzip variant.
LARGE = b'{"name":"Ada","notes":"' + b"analytical engine " * 100 + b'"}'
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def cors_jetway(redis_server, page_server, tmp_path_factory) -> Iterator[JetwayServer]:
    """A Jetway that allows the page server's origin, with authorization and its access log on."""
    env = {"JETWAY_CORS_ORIGINS": page_server.origin, "JETWAY_ACCESS_LOG": "on"}
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("cors") / "jetway.log", env=env, auth=True)
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


class Page:
    """The browser on a page of the allowed origin, the server it calls, and a token for it."""

    def __init__(self, browser: Browser, server: JetwayServer, token: str) -> None:
        self.browser = browser
        self.server = server
        self.token = token

    def fetch(self, path: str, token: str = "", **init: Any) -> Fetched:
        """``fetch`` of a Jetway path with the token (and ``init``'s headers, method, body, cache)."""
        headers = {"Authorization": f"Bearer {token or self.token}", **init.pop("headers", {})}
        return self.browser.fetch(self.server.url(path), headers=headers, **init)

    def served(self, request_id: str) -> Dict[str, Any]:
        """The access line of the request the page sent with ``X-Request-ID: request_id``."""
        lines: List[Dict[str, Any]] = []
        wait_until(lambda: lines.extend(self.access_lines(request_id=request_id)) or lines, 10, request_id)
        return lines[0]

    def access_lines(self, **fields: Any) -> List[Dict[str, Any]]:
        """The server's access lines whose fields have these values."""
        found = []
        for line in self.server.log_path.read_text().splitlines():
            record = json.loads(line) if line.startswith("{") else {}
            if record.get("namespace") == "jetway.access" and all(record.get(k) == v for k, v in fields.items()):
                found.append(record)
        return found


@pytest.fixture
def page(browser, page_server, cors_jetway, redis_client) -> Page:
    token = cors_jetway.make_token("page", "read:*", "write:things")
    browser.open(page_server.add("front.html", PAGE))
    return Page(browser, cors_jetway, token)


def request_id() -> str:
    return uuid.uuid4().hex


def put(server: JetwayServer, path: str, body: bytes, token: str) -> requests.Response:
    """A write from outside the browser (test data)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    response = requests.put(server.url(path), data=body, headers=headers, timeout=10)
    assert response.status_code in (200, 201), response.text
    return response


def test_a_page_reads_a_document(page):
    stored = put(page.server, "/v1/things/t1", DOCUMENT, page.token)
    read = page.fetch("/v1/things/t1")
    assert read.error is None, read.error
    assert (read.status, read.type, read.body) == (200, "cors", DOCUMENT.decode())
    assert read.headers["etag"] == stored.headers["ETag"]
    assert read.headers["content-type"] == "application/json"
    assert len(read.headers["x-request-id"]) == 32


def test_the_preflight_is_answered_without_a_token_and_the_request_follows(page):
    put(page.server, "/v1/things/p1", DOCUMENT, page.token)
    read = page.fetch("/v1/things/p1", headers={"X-Request-ID": request_id()})
    assert read.status == 200, read
    wait_until(lambda: len(page.access_lines(path="/v1/things/p1")) >= 3, 10, "the access log")
    served = [(line["method"], line["status"]) for line in page.access_lines(path="/v1/things/p1")]
    assert served == [("PUT", 201), ("OPTIONS", 204), ("GET", 200)]


def test_a_page_creates_reads_replaces_patches_and_deletes_a_document(page):
    key = request_id()
    init = {"method": "POST", "body": DOCUMENT.decode(), "headers": {"Content-Type": "application/json"}}
    created = page.fetch("/v1/things", headers={**init.pop("headers"), "Idempotency-Key": key}, **init)
    assert created.status == 201, created
    location = created.headers["location"]
    assert location.startswith("/v1/things/")
    again = page.fetch(
        "/v1/things",
        method="POST",
        body=DOCUMENT.decode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    assert (again.status, again.headers["location"], again.headers["idempotency-replayed"]) == (201, location, "true")

    read = page.fetch(location)
    assert (read.status, read.body, read.headers["etag"]) == (200, DOCUMENT.decode(), created.headers["etag"])

    replacement = '{"name":"Ada Lovelace"}'
    headers = {"Content-Type": "application/json", "If-Match": read.headers["etag"]}
    replaced = page.fetch(location, method="PUT", body=replacement, headers=headers)
    assert replaced.status == 200, replaced
    assert replaced.headers["etag"] != read.headers["etag"]
    assert page.fetch(location).body == replacement

    headers = {"Content-Type": "application/merge-patch+json", "If-Match": replaced.headers["etag"]}
    patched = page.fetch(location, method="PATCH", body='{"born":1815}', headers=headers)
    assert (patched.status, patched.json()) == (200, {"name": "Ada Lovelace", "born": 1815})

    deleted = page.fetch(location, method="DELETE", headers={"If-Match": patched.headers["etag"]})
    assert (deleted.status, deleted.body) == (204, "")
    assert page.fetch(location).status == 404


def assert_problem(fetched: Fetched, status: int, problem: str, handled: bool = True) -> Dict[str, Any]:
    """The page read the problem document itself, not a network error (``handled``: by a handler, with its id)."""
    assert fetched.error is None, fetched.error
    assert (fetched.status, fetched.type, fetched.headers["content-type"]) == (status, "cors", PROBLEM)
    document = fetched.json()
    assert (document["status"], document["type"]) == (status, "urn:jetway:problem:" + problem)
    if handled:
        assert len(fetched.headers["x-request-id"]) == 32
    return document


def test_a_page_reads_401_404_and_412_as_problem_documents_on_any_path(page):
    assert_problem(page.fetch("/v1/things/t1", token="jw_" + "x" * 43), 401, "unauthorized")
    assert_problem(page.fetch("/v1/things/nothing-here"), 404, "not-found")
    # A path no route serves: its preflight is granted, so the page reads the 404 too.
    assert_problem(page.fetch("/v2/things/t1"), 404, "no-route")
    stored = put(page.server, "/v1/things/t412", DOCUMENT, page.token)
    headers = {"Content-Type": "application/json", "If-Match": '"not-its-etag"'}
    stale = page.fetch("/v1/things/t412", method="PUT", body="{}", headers=headers)
    assert_problem(stale, 412, "precondition-failed")
    assert page.fetch("/v1/things/t412").headers["etag"] == stored.headers["ETag"]


def test_a_page_reads_429_and_the_ratelimit_headers(page):
    rated = page.server.make_token("rated", "read:*", rate="2/h")
    put(page.server, "/v1/things/t429", DOCUMENT, page.token)
    first = page.fetch("/v1/things/t429", token=rated)
    assert first.status == 200, first
    assert (first.headers["ratelimit-limit"], first.headers["ratelimit-remaining"]) == ("2", "1")
    page.fetch("/v1/things/t429", token=rated)
    over = page.fetch("/v1/things/t429", token=rated)
    assert_problem(over, 429, "rate-limited")
    assert (over.headers["ratelimit-limit"], over.headers["ratelimit-remaining"]) == ("2", "0")
    assert int(over.headers["retry-after"]) > 0
    assert int(over.headers["ratelimit-reset"]) > 0


def test_the_browser_cache_revalidates_a_document_and_the_page_gets_the_body(page):
    put(page.server, "/v1/things/c1", DOCUMENT, page.token)
    ids = [request_id() for _ in range(4)]
    first = page.fetch("/v1/things/c1", headers={"X-Request-ID": ids[0]})
    assert (first.status, first.headers["cache-control"]) == (200, "no-cache")
    # The default cache mode: the stored answer says no-cache, so Chromium asks with its ETag.
    second = page.fetch("/v1/things/c1", headers={"X-Request-ID": ids[1]})
    # cache: "no-cache" asks the same way whatever the answer said.
    third = page.fetch("/v1/things/c1", headers={"X-Request-ID": ids[2]}, cache="no-cache")
    assert [page.served(i)["status"] for i in ids[:3]] == [200, 304, 304]
    for seen in (second, third):
        assert (seen.status, seen.body, seen.headers["etag"]) == (200, DOCUMENT.decode(), first.headers["etag"])

    # A change made elsewhere: the revalidation brings the new body.
    changed = put(page.server, "/v1/things/c1", b'{"name":"changed"}', page.token)
    fourth = page.fetch("/v1/things/c1", headers={"X-Request-ID": ids[3]})
    assert page.served(ids[3])["status"] == 200
    assert (fourth.body, fourth.headers["etag"]) == ('{"name":"changed"}', changed.headers["ETag"])


def test_the_browser_decodes_the_stored_gzip_variant(page):
    assert CODINGS == ("gzip",), "a new stored coding needs its browser test here"
    stored = put(page.server, "/v1/things/big", LARGE, page.token)
    read = page.fetch("/v1/things/big")
    assert read.status == 200, read
    assert read.json() == json.loads(LARGE)
    assert read.body == LARGE.decode()
    assert read.headers["content-encoding"] == "gzip"
    assert read.headers["etag"] == stored.headers["ETag"][:-1] + '-gzip"'
    # What came over the wire is the stored variant, much smaller than the document.
    assert int(read.headers["content-length"]) < len(LARGE) / 4


def test_a_page_from_an_origin_not_allowed_reads_nothing(page, page_server):
    put(page.server, "/v1/things/secret", DOCUMENT, page.token)
    other = page_server.add("other.html", PAGE).replace(page_server.origin, page_server.origin_as("localhost"))
    page.browser.open(other)
    # With a token: the preflight is refused, and the GET is never sent.
    refused = page.fetch("/v1/things/secret")
    assert (refused.error, refused.status, refused.body) == ("TypeError: Failed to fetch", 0, "")
    # Without one (no preflight): the server answers, and the page still reads nothing.
    simple = page.browser.fetch(page.server.url("/v1/things/secret"))
    assert (simple.error, simple.status, simple.body) == ("TypeError: Failed to fetch", 0, "")
    wait_until(lambda: len(page.access_lines(path="/v1/things/secret")) >= 3, 10, "the access log")
    served = [(line["method"], line["status"]) for line in page.access_lines(path="/v1/things/secret")]
    # The test's own PUT, the refused preflight (no GET after it), the simple GET's 401.
    assert served == [("PUT", 201), ("OPTIONS", 204), ("GET", 401)]


def test_a_page_reads_the_connections_413_for_a_body_over_the_limit(page):
    body = '{"text":"' + "a" * (1024 * 1024 + 10) + '"}'
    headers = {"Content-Type": "application/json"}
    too_large = page.fetch("/v1/things/huge", method="PUT", body=body, headers=headers)
    # The connection's own answer, before any handler (so without X-Request-ID).
    assert_problem(too_large, 413, "body-too-large", handled=False)
    assert page.fetch("/v1/things/huge").status == 404
