"""The session's OpenID Connect provider (tests/identity/oidc_provider.py), started once: 1-3 s here."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.identity.oidc_provider import OidcProvider


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """node-oidc-provider with users alice and bob and the service client svc; stopped by its pid."""
    with OidcProvider(tmp_path_factory.mktemp("oidc-provider")) as provider:
        yield provider
