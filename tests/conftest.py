"""Fixtures: one real redis-server and one real Jetway for the session (each
pytest-xdist worker's own, under ``make test``).

Redis is flushed before each test that uses it. Each fixture stops what it
started, whatever the test did. ``JETWAY_TEST_TOPOLOGY=cluster`` (or
``sentinel``) puts a 3-master Redis Cluster (or a Sentinel group) behind the
same fixtures, so the API tests run unchanged on it (``make test-cluster``).
Tests marked ``slow`` (the fuzzers, the load-test gate, reloads under load:
each over ten seconds) are skipped unless ``JETWAY_TEST_SLOW=1`` (``make
test-slow``), to bring ``make test`` toward ten minutes; those marked ``consistency``
(tests/consistency/) unless ``JETWAY_TEST_CONSISTENCY=1`` (``make
test-consistency``).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import redis
import requests

from cache.collection_settings import CHANGED_CHANNEL as SETTINGS_CHANNEL
from cache.collection_settings import NAMES_KEY as SETTINGS_NAMES
from cache.settings_cache import FORGET_ALL
from tests.browser import Browser, PageServer, missing_browser
from tests.multinode import servers_for
from tests.support import JetwayServer, RedisServer

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
TOKEN_KEYS = "jw:{tokens}*"
TOKEN = re.compile(r"jw_[A-Za-z0-9_-]{43}")

pytest_plugins = ("tests.pypy_gc_guard",)


@pytest.fixture(scope="session", autouse=True)
def no_token_in_any_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the whole suite: no log any server wrote holds a token."""
    yield
    logs = tmp_path_factory.getbasetemp().rglob("*.log")
    leaks = [f"{path}: {token}" for path in logs for token in TOKEN.findall(path.read_text(errors="replace"))]
    assert not leaks, leaks


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = servers_for(tmp_path_factory.mktemp("redis"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that stop or break it."""
    server = RedisServer(tmp_path / "redis")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def jetway(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JetwayServer]:
    """The session's server, with authorization on, and its all-scopes token."""
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("jetway") / "jetway.log", auth=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def suite_token(jetway: JetwayServer, redis_server: RedisServer) -> Tuple[str, Dict[bytes, bytes]]:
    """An admin token, and a DUMP of its keys so each test can restore it after the flush."""
    client = redis_server.client()
    client.flushall()
    token = jetway.make_token("suite", "admin")
    saved = {key: client.dump(key) for key in client.scan_iter(TOKEN_KEYS)}
    client.close()
    return token, saved


def flush(client: redis.Redis) -> None:
    """Empty Redis, and tell the running workers' settings caches when there were settings to forget."""
    had_settings = client.exists(SETTINGS_NAMES)
    client.flushall()
    if had_settings:
        # A flush publishes nothing: tell the workers' settings caches (cache/settings_cache.py).
        client.publish(SETTINGS_CHANNEL, FORGET_ALL)
        time.sleep(0.05)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    flush(client)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def api(jetway: JetwayServer, redis_client: redis.Redis, suite_token) -> Iterator[Api]:
    """A client for the session's Jetway (with the suite token), on a freshly flushed Redis."""
    token, saved = suite_token
    for key, value in saved.items():
        redis_client.restore(key, 0, value, replace=True)
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {token}"
        yield Api(jetway, session)


@pytest.fixture(scope="session")
def session_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One headless Chromium for the session (~1.5 s to start); ``browser`` resets it per test."""
    missing = missing_browser()
    assert missing is None, missing
    browser = Browser(tmp_path_factory.mktemp("browser"))
    try:
        yield browser.start()
    finally:
        browser.stop()


@pytest.fixture
def browser(session_browser: Browser) -> Browser:
    """The session's browser on a blank tab, with no cache, cookies or storage left from another test."""
    session_browser.reset()
    return session_browser


@pytest.fixture(scope="session")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageServer]:
    """Pages on a second origin: ``page_server.add(name, html)`` returns its URL."""
    directory = tmp_path_factory.mktemp("pages")
    server = PageServer(directory / "www", directory / "page_server.log")
    try:
        yield server.start()
    finally:
        server.stop()


SLOW = os.environ.get("JETWAY_TEST_SLOW") == "1"
CONSISTENCY = os.environ.get("JETWAY_TEST_CONSISTENCY") == "1"


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Mark the tests that drive the browser ``browser``; skip ``slow`` ones unless ``JETWAY_TEST_SLOW=1``.

    The ``consistency`` ones (tests/consistency/) run only with ``JETWAY_TEST_CONSISTENCY=1``.
    """
    skip_slow = pytest.mark.skip(reason="slow: run by make test-slow")
    skip_consistency = pytest.mark.skip(reason="consistency: run by make test-consistency")
    for item in items:
        if not CONSISTENCY and item.get_closest_marker("consistency") is not None:
            item.add_marker(skip_consistency)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        if not SLOW and item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)


def document_keys(client: redis.Redis) -> List[bytes]:
    """Every key but the suite token's."""
    return [key for key in client.scan_iter() if not key.startswith(b"jw:{tokens}")]


class Api:
    """Thin helper: ``api.get('/v1/users/u1')`` and friends, no magic."""

    def __init__(self, server: JetwayServer, session: requests.Session) -> None:
        self.server = server
        self.session = session

    @property
    def auth_header(self) -> Dict[str, str]:
        """For requests sent outside this client's session."""
        return {"Authorization": self.session.headers["Authorization"]}

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        return self.session.request(method, self.server.url(path), **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def head(self, path: str, **kwargs) -> requests.Response:
        return self.request("HEAD", path, **kwargs)

    def delete(self, path: str, **kwargs) -> requests.Response:
        return self.request("DELETE", path, **kwargs)

    def send(
        self, method: str, path: str, body: bytes, content_type: Optional[str] = JSON, **kwargs
    ) -> requests.Response:
        """``body`` with ``content_type`` (None: no Content-Type header at all)."""
        headers = dict(kwargs.pop("headers", {}))
        if content_type is not None:
            headers.setdefault("Content-Type", content_type)
        return self.request(method, path, data=body, headers=headers, **kwargs)

    def put_json(self, path: str, body: bytes, **kwargs) -> requests.Response:
        return self.send("PUT", path, body, **kwargs)

    def post_json(self, path: str, body: bytes, **kwargs) -> requests.Response:
        return self.send("POST", path, body, **kwargs)

    def patch_merge(self, path: str, body: bytes, **kwargs) -> requests.Response:
        return self.send("PATCH", path, body, MERGE_PATCH, **kwargs)

    def raw(self, method: str, target: str, body: bytes = b"", headers: Optional[Dict[str, str]] = None) -> RawResponse:
        """Send ``target`` exactly as given: requests would resolve ``..`` in a path."""
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        headers = {**self.auth_header, **(headers or {})}
        try:
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            return RawResponse(response.status, dict(response.getheaders()), response.read())
        finally:
            connection.close()


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: Dict[str, str]
    body: bytes


@pytest.fixture
def pipe() -> Iterator[Tuple[int, int]]:
    """A pipe's read and write ends, both closed after the test (a test may close either itself)."""
    read_end, write_end = os.pipe()
    try:
        yield read_end, write_end
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)
