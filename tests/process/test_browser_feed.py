"""The change feed followed from a real browser: ``EventSource`` with a ticket, across a graceful reload.

A page on another origin (allowed by ``JETWAY_CORS_ORIGINS``) asks for a
ticket with its bearer token (``fetch``, so Chromium preflights it), then
opens ``new EventSource(".../v1/_changes/{coll}?ticket=…")``: a browser's
EventSource cannot send ``Authorization``. While a writer outside the
browser writes, the master is sent SIGHUP (its workers are replaced one at
a time); each stream then ends with a ``reconnect`` event, and the browser
reconnects by itself (after the stream's ``retry:``) with ``Last-Event-ID``.
What the page received is checked against what the writes answered.
"""

from __future__ import annotations

import signal
import time
from typing import Dict, Iterator, List

import pytest

from tests.handlers.test_changes import Writer
from tests.support import JetwayServer, wait_until

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>a dashboard</title></head>
<body><p>a page that follows a collection</p></body></html>
"""
COLLECTION = "feedweb"
# Opens the feed with the ticket and keeps what arrives in window globals.
_FOLLOW = """
const [url] = arguments;
window.__changes = [];
window.__named = [];
window.__errors = 0;
const source = new EventSource(url);
window.__source = source;
source.onmessage = (event) => {
  const change = JSON.parse(event.data);
  window.__changes.push([change.id, change.etag, event.lastEventId]);
};
for (const name of ["ready", "reconnect", "fell-behind", "lost"]) {
  source.addEventListener(name, () => window.__named.push(name));
}
source.onerror = () => { window.__errors += 1; };
await new Promise((resolve, reject) => {
  source.addEventListener("ready", resolve, {once: true});
  setTimeout(() => reject(new Error("no ready event; readyState " + source.readyState)), 20000);
});
return source.readyState;
"""


class Api:
    """What ``tests.handlers.test_changes.Writer`` needs: the server and a token's header."""

    def __init__(self, server: JetwayServer, token: str) -> None:
        self.server = server
        self.auth_header = {"Authorization": f"Bearer {token}"}


@pytest.fixture
def feed_jetway(redis_server, page_server, tmp_path) -> Iterator[JetwayServer]:
    """Two workers, authorization on, the page server's origin allowed."""
    env = {"JETWAY_CORS_ORIGINS": page_server.origin, "JETWAY_GRACE": "20"}
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log", env=env, auth=True)
    try:
        yield server.start(["--workers", "2"])
    finally:
        server.stop()


def received(browser) -> List[List[str]]:
    return browser.run("return window.__changes;")


@pytest.mark.slow
def test_an_event_source_with_a_ticket_gets_every_write_once_in_order_across_a_reload(
    browser, page_server, feed_jetway
):
    token = feed_jetway.make_token("dashboard", f"read:{COLLECTION}", f"write:{COLLECTION}")
    browser.open(page_server.add("dashboard.html", PAGE))
    asked = browser.fetch(
        feed_jetway.url(f"/v1/_changes/{COLLECTION}/tickets"),
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert asked.error is None and asked.status == 201, asked
    ticket = asked.json()["ticket"]
    assert browser.run(_FOLLOW, feed_jetway.url(f"/v1/_changes/{COLLECTION}?ticket={ticket}")) == 1  # OPEN

    writer = Writer(Api(feed_jetway, token), COLLECTION, [f"d{n}" for n in range(4)], pause=0.01)
    writer.start()
    try:
        time.sleep(2)
        feed_jetway.process.send_signal(signal.SIGHUP)
        # Until the replaced workers' streams have ended and the page is back on a new one.
        wait_until(lambda: browser.run("return window.__named;").count("ready") >= 2, 30, "the page's reconnect")
        time.sleep(2)
    finally:
        writer.stopping.set()
        writer.join(30)
    assert not writer.failures, writer.failures[:5]
    assert writer.total > 50
    wait_until(lambda: len(received(browser)) >= writer.total, 30, f"{writer.total} changes in the page")
    time.sleep(1)  # anything more (a repeat) would arrive now
    changes = received(browser)
    named = browser.run("window.__source.close(); return window.__named;")

    seen: Dict[str, List[str]] = {doc: [] for doc in writer.etags}
    for doc, etag, _ in changes:
        seen[doc].append(etag)
    assert len(changes) == writer.total
    assert seen == writer.etags  # each document's writes: all of them, once each, in the order written
    assert all(last_id for _, _, last_id in changes)
    assert "reconnect" in named and named.count("ready") >= 2, named
    assert "fell-behind" not in named and "lost" not in named, named
