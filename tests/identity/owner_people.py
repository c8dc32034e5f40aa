"""The people of the owner rule's end-to-end tests: a Jetway, alice, bob, a user holding admin, and the service.

The collection ``notes`` declares ``{"owner": {"pointer": "/owner"}}``.
Shared by ``tests/identity/test_owner_rule.py`` and
``tests/identity/test_owner_rule_bulk.py`` (import ``server`` and ``people``
as fixtures).
"""

from __future__ import annotations

import json
import time
from typing import Dict, Iterator, Optional

import pytest
import requests

from tests.identity.test_bearer_jwt import issuers_file, serve
from tests.support import JetwayServer

SETTINGS = {"owner": {"pointer": "/owner"}}


@pytest.fixture(scope="module")
def server(redis_server, oidc_provider, tmp_path_factory) -> Iterator[JetwayServer]:
    directory = tmp_path_factory.mktemp("owner-rule")
    jetway = serve(redis_server.url, directory, issuers_file(directory, oidc_provider.issuer))
    try:
        yield jetway
    finally:
        jetway.stop()


class Caller:
    """One caller's requests, with its bearer token."""

    def __init__(self, server: JetwayServer, token: str) -> None:
        self.server = server
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def send(self, method: str, path: str, body: Optional[object] = None, **headers: str) -> requests.Response:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        if data is not None:
            headers.setdefault("Content-Type", "application/json")
        return self.session.request(method, self.server.url(path), data=data, headers=headers, timeout=10)


@pytest.fixture
def people(server, redis_client, oidc_provider) -> Dict[str, Caller]:
    """alice, bob, a user holding admin, and the service (Jetway's own admin token); notes under the rule."""
    service = Caller(server, server.make_token("service", "admin"))
    assert service.send("PUT", "/v1/_collections/notes", SETTINGS).status_code in (200, 201)
    time.sleep(0.2)  # the settings change reaches the worker's settings cache (a message)
    scope = "read:notes write:notes"
    return {
        "alice": Caller(server, oidc_provider.token("alice", scope)),
        "bob": Caller(server, oidc_provider.token("bob", scope)),
        "root": Caller(server, oidc_provider.token("bob", f"{scope} admin")),
        "service": service,
    }
