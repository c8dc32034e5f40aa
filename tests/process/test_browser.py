"""The browser harness (tests/browser.py): a second origin, scripts in a page, nothing left running.

Cross-origin reads of Jetway need CORS (issue 20); these tests use only
what works without it: a same-origin fetch from a page of Jetway's own, and
a ``no-cors`` fetch, whose answer a browser never lets a page read.
"""

from __future__ import annotations

import os

import pytest

from tests.browser import Browser, PageScriptError, PageServer, process_group

SECOND_ORIGIN_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>second origin</title></head>
<body><p id="greeting">served by the page server</p></body></html>
"""


def test_a_page_of_the_second_origin_loads(browser, page_server, jetway):
    url = page_server.add("hello.html", SECOND_ORIGIN_PAGE)
    browser.open(url)
    seen = browser.run("return [location.origin, document.title, document.getElementById('greeting').textContent]")
    assert seen == [page_server.origin, "second origin", "served by the page server"]
    assert page_server.origin != jetway.base
    assert url in browser.requested_urls()


def test_a_page_of_jetways_origin_fetches_healthz_and_reads_every_header(browser, jetway):
    browser.open(jetway.url("/healthz"))
    fetched = browser.fetch("/healthz")
    assert fetched.error is None
    assert (fetched.status, fetched.type, fetched.json()) == (200, "basic", {"status": "ok"})
    # Same origin: every header is readable, not only the CORS-safelisted ones.
    assert len(fetched.headers["x-request-id"]) == 32


def test_the_browser_takes_jetway_for_another_origin_than_the_page_server(browser, page_server, jetway):
    browser.open(page_server.add("other.html", SECOND_ORIGIN_PAGE))
    fetched = browser.fetch(jetway.url("/healthz"), mode="no-cors")
    # An opaque answer: the request went out, and the page may read nothing of it.
    assert (fetched.error, fetched.type, fetched.status, fetched.body, fetched.headers) == (None, "opaque", 0, "", {})
    assert jetway.url("/healthz") in browser.requested_urls()


def test_the_page_server_answers_under_a_third_origin_too(browser, page_server):
    url = page_server.add("third.html", SECOND_ORIGIN_PAGE).replace(
        page_server.origin, page_server.origin_as("localhost")
    )
    browser.open(url)
    assert browser.run("return location.origin") == page_server.origin_as("localhost") != page_server.origin


def test_a_script_error_comes_back_with_its_message(browser, page_server):
    browser.open(page_server.add("errors.html", SECOND_ORIGIN_PAGE))
    with pytest.raises(PageScriptError, match="ReferenceError: nothingHere is not defined"):
        browser.run("return nothingHere + 1")
    assert browser.run("const [a, b] = arguments; await new Promise((r) => setTimeout(r, 10)); return a + b", 2, 3) == 5


def test_a_console_error_is_reported(browser, page_server):
    browser.open(page_server.add("console.html", SECOND_ORIGIN_PAGE))
    browser.run("console.error('something went wrong')")
    assert any("something went wrong" in line for line in browser.console_errors())


@pytest.mark.browser
def test_stop_leaves_no_chromium_chromedriver_or_page_server_running(tmp_path):
    browser = Browser(tmp_path / "browser")
    pages = PageServer(tmp_path / "pages", tmp_path / "pages.log")
    try:
        browser.start()
        pages.start()
        browser.open(pages.add("a.html", SECOND_ORIGIN_PAGE))
        chromium, driver, server = browser.chromium.pid, browser.service.process.pid, pages.process.pid
        assert len(process_group(chromium)) > 1, "chromium runs its helpers in its own group"
    finally:
        browser.stop()
        pages.stop()
    assert process_group(chromium) == []
    # chromedriver and the page server were children of this process, reaped by stop.
    for pid in (driver, server):
        assert not os.path.exists(f"/proc/{pid}"), pid
