"""Fixtures: one real redis-server and one real Jetway for the session.

Redis is flushed before each test that uses it. Each fixture stops what it
started, whatever the test did.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import redis
import requests

from tests.support import JetwayServer, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def jetway(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JetwayServer]:
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("jetway") / "jetway.log")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def api(jetway: JetwayServer, redis_client: redis.Redis) -> Iterator[Api]:
    """A client for the session's Jetway, on a freshly flushed Redis."""
    with requests.Session() as session:
        yield Api(jetway, session)


class Api:
    """Thin helper: ``api.get('/v1/users/u1')`` and friends, no magic."""

    def __init__(self, server: JetwayServer, session: requests.Session) -> None:
        self.server = server
        self.session = session

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        return self.session.request(method, self.server.url(path), **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def put_json(self, path: str, body: bytes, **kwargs) -> requests.Response:
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        return self.request("PUT", path, data=body, headers=headers, **kwargs)
