"""``/docs``: Swagger UI from the packaged copy, its policy and caching, and a real browser using it.

The browser test renders the page in headless Chromium (tests/browser.py),
checks that every operation of ``/openapi.json`` is shown and that nothing
came from another origin, authorizes with a token through the Authorize
button and runs "Try it out" on a stored document. ``SCREENSHOT_DOCS=path``
also saves its screenshot there (docs/api.md shows it: ``docs/images/docs.png``).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
from pathlib import Path
from typing import Iterator, Set, Tuple

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from swagger_ui_bundle import swagger_ui_path

from api.app import make_app
from api.config import Settings
from handlers.docs import CONTENT_SECURITY_POLICY, START_SCRIPT, accepts_gzip, packaged_site
from tests.browser import SCRIPT_TIMEOUT
from tests.support import JetwayServer

BOOK = b'{"title":"Dune","author":"Frank Herbert","year":1965}'
HTTP_METHODS = ("get", "head", "put", "patch", "delete", "post", "options")
# Swagger UI's block of the document read (operations-<tag>-<operationId>).
READ = "#operations-documents-getDocument"


def get(jetway: JetwayServer, path: str, **headers: str) -> requests.Response:
    """Without a token: the page and its assets need none."""
    return requests.get(jetway.url(path), headers=headers, timeout=10)


def asset_urls(page: str) -> Set[str]:
    return set(re.findall(r'(?:src|href)="(/docs/assets/[^"]+)"', page))


# -- over HTTP -----------------------------------------------------------------


def test_the_page_needs_no_token_and_carries_its_policy(jetway):
    response = get(jetway, "/docs")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert "://" not in response.text, "the page names nothing on another origin"
    assert {url.split("?")[0] for url in asset_urls(response.text)} == {
        "/docs/assets/swagger-ui.css",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/start.js",
    }
    assert get(jetway, "/docs/").content == response.content


def test_the_policy_allows_this_origin_only():
    directives = dict(part.split(" ", 1) for part in CONTENT_SECURITY_POLICY.split("; "))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == directives["style-src"] == "'self'"  # nothing inline, no eval
    sources = " ".join(directives.values()).split()
    assert all(source in ("'self'", "'none'", "data:") for source in sources), sources
    assert directives["frame-ancestors"] == "'none'"


def test_the_page_is_revalidated_by_its_etag(jetway):
    etag = get(jetway, "/docs").headers["ETag"]
    again = get(jetway, "/docs", **{"If-None-Match": etag})
    assert (again.status_code, again.content, again.headers["ETag"]) == (304, b"", etag)
    assert get(jetway, "/docs", **{"If-None-Match": '"other"'}).status_code == 200


def test_assets_named_with_their_version_are_kept_a_year(jetway):
    page = get(jetway, "/docs").text
    for url in asset_urls(page):
        response = get(jetway, url)
        assert response.status_code == 200, url
        assert response.headers["Cache-Control"] == "public, max-age=31536000, immutable", url
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Vary"] == "Accept-Encoding"
        # The version is the content's: the page names a new URL when the bytes change.
        assert url.endswith("?v=" + response.headers["ETag"].strip('"'))
        unversioned = get(jetway, url.split("?")[0])
        assert (unversioned.content, unversioned.headers["Cache-Control"]) == (response.content, "no-cache")


def test_assets_are_the_packaged_files_gzipped_for_a_client_that_takes_gzip(jetway):
    bundle = (swagger_ui_path / "swagger-ui-bundle.js").read_bytes()
    raw = requests.get(jetway.url("/docs/assets/swagger-ui-bundle.js"), headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in raw.headers
    assert raw.content == bundle
    assert raw.headers["Content-Type"] == "text/javascript; charset=utf-8"
    with requests.get(jetway.url("/docs/assets/swagger-ui-bundle.js"), stream=True, timeout=10) as zipped:
        assert zipped.headers["Content-Encoding"] == "gzip"
        body = zipped.raw.read()
    assert len(body) < len(bundle) / 3 and gzip.decompress(body) == bundle
    assert get(jetway, "/docs/assets/start.js").content == START_SCRIPT
    css = get(jetway, "/docs/assets/swagger-ui.css")
    assert css.headers["Content-Type"] == "text/css; charset=utf-8"
    assert css.content == (swagger_ui_path / "swagger-ui.css").read_bytes()


def test_an_asset_is_revalidated_by_its_etag_and_an_unknown_one_is_a_404_problem(jetway):
    etag = get(jetway, "/docs/assets/start.js").headers["ETag"]
    assert get(jetway, "/docs/assets/start.js", **{"If-None-Match": f"W/{etag}"}).status_code == 304
    for path in ("/docs/assets/index.html", "/docs/assets/..%2Fdocs.py", "/docs/assets/swagger-ui.js.map"):
        missing = get(jetway, path)
        assert missing.status_code == 404, path
        assert missing.json()["type"] == "urn:jetway:problem:no-route"


@pytest.mark.parametrize(
    "header,gzipped",
    [
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.8", True),
        ("GZIP", True),
        ("x-gzip", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("gzip;q=nonsense", False),
        ("identity", False),
        ("", False),
        (None, False),
    ],
)
def test_accept_encoding_takes_gzip_unless_its_quality_is_zero(header, gzipped):
    assert accepts_gzip(header) is gzipped


@pytest.fixture
def docs_off(redis_server, tmp_path) -> Iterator[JetwayServer]:
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log", env={"JETWAY_DOCS": "off"})
    try:
        yield server.start()
    finally:
        server.stop()


def test_jetway_docs_off_removes_the_page_its_assets_and_their_description(docs_off):
    for path in ("/docs", "/docs/assets/start.js"):
        response = get(docs_off, path)
        assert (response.status_code, response.json()["type"]) == (404, "urn:jetway:problem:no-route"), path
    paths = get(docs_off, "/openapi.json").json()["paths"]
    assert "/openapi.json" in paths and not [path for path in paths if path.startswith("/docs")]


# -- in a browser ------------------------------------------------------------------


def documented_operations(api) -> Set[Tuple[str, str]]:
    paths = api.get("/openapi.json").json()["paths"]
    return {(method, path) for path, item in paths.items() for method in item if method in HTTP_METHODS}


def shown_operations(browser) -> Set[Tuple[str, str]]:
    """(method, path) of every operation block Swagger UI rendered."""
    return {
        (
            block.get_attribute("class").split("opblock-")[1].split()[0],
            block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
        )
        for block in browser.driver.find_elements(By.CSS_SELECTOR, ".opblock")
    }


def try_document_read(browser, collection: str, doc_id: str, expected: str) -> None:
    """Fill in the document read's parameters, execute, and wait for ``expected`` as the status shown."""
    block = browser.wait_for(READ)
    for name, value in (("collection", collection), ("id", doc_id)):
        field = block.find_element(By.CSS_SELECTOR, f'tr[data-param-name="{name}"] input')
        field.clear()
        field.send_keys(value)
    block.find_element(By.CSS_SELECTOR, "button.execute").click()
    status = f"{READ} .live-responses-table tr.response .response-col_status"

    def shown() -> str:
        found = browser.driver.find_elements(By.CSS_SELECTOR, status)
        return found[0].text.split()[0] if found and found[0].text.strip() else ""

    WebDriverWait(browser.driver, SCRIPT_TIMEOUT).until(lambda _: shown() == expected, f"not {expected}: {shown()}")


@pytest.mark.slow
def test_swagger_ui_shows_every_operation_authorizes_and_reads_a_document(browser, api, tmp_path):
    assert api.put_json("/v1/books/dune", BOOK).status_code == 201
    token = api.auth_header["Authorization"].split(" ", 1)[1]
    browser.open(api.server.url("/docs"))
    browser.wait_for(READ)

    assert shown_operations(browser) == documented_operations(api)
    # The page as a visitor first sees it (the picture in docs/api.md; its curl lines would show the token).
    screenshot = tmp_path / "docs.png"
    browser.screenshot(screenshot, "#swagger-ui", max_height=1000)
    if os.environ.get("SCREENSHOT_DOCS"):
        shutil.copy(screenshot, Path(os.environ["SCREENSHOT_DOCS"]))

    # Try it out before authorizing: the read is refused.
    browser.driver.find_element(By.CSS_SELECTOR, f"{READ} .opblock-summary").click()
    browser.wait_for(f"{READ} .try-out__btn").click()
    try_document_read(browser, "books", "dune", "401")

    # Authorize: the bearer scheme's dialog takes the token.
    browser.driver.find_element(By.CSS_SELECTOR, ".auth-wrapper .btn.authorize").click()
    browser.wait_for(".auth-container input").send_keys(token)
    browser.driver.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper .btn.modal-btn.authorize").click()
    browser.wait_for(".auth-btn-wrapper .btn-done").click()

    try_document_read(browser, "books", "dune", "200")
    assert browser.run("return localStorage.length") == 0, "the token is kept in memory only"
    body = browser.wait_for(f"{READ} .live-responses-table tr.response .response-col_description pre")
    assert "Frank Herbert" in body.text
    curl = browser.driver.find_element(By.CSS_SELECTOR, f"{READ} .curl-command").text
    assert "Authorization: Bearer" in curl

    # Everything came from Jetway's origin (data: URIs are the stylesheet's icons).
    requested = browser.requested_urls()
    assert api.server.url("/v1/books/dune") in requested
    assert [url for url in requested if not url.startswith((api.server.base + "/", "data:"))] == []
    loaded = browser.run("return performance.getEntries().map((entry) => entry.name)")
    assert [name for name in loaded if name.startswith("http") and not name.startswith(api.server.base + "/")] == []
    assert browser.policy_violations() == []
    # The console's one complaint is the refused read before authorizing.
    errors = browser.console_errors()
    assert len(errors) == 1 and "the server responded with a status of 401" in errors[0], errors


def test_the_site_is_loaded_by_its_first_request_not_by_a_starting_worker():
    # The bundle and its gzip are 1.8 MB of a worker's heap that most workers never send.
    packaged_site.cache_clear()
    make_app(Settings(access_log=False, docs=True), store=object(), gate=None, reactor=None)
    assert packaged_site.cache_info().currsize == 0
    site = packaged_site()
    assert packaged_site() is site
    assert gzip.decompress(site.assets["swagger-ui-bundle.js"].gzipped) == site.assets["swagger-ui-bundle.js"].body
