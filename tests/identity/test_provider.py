"""The suite's OpenID Connect provider does what the tests will lean on.

Its tokens are RFC 9068 JWTs signed by a key it publishes, with the claims
asked for; they expire when told; its keys rotate in the documented phases.
Signatures are checked with joserfc where it is installed (the library
Jetway verifies with), else with ``cryptography`` directly.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicNumbers

from tests.identity.oidc_provider import SERVICE_CLIENT, USER_CLIENT, OidcProvider, ProviderError

try:
    from joserfc import jwt
    from joserfc.errors import JoseError
    from joserfc.jwk import KeySet
except ImportError:  # not yet in requirements.txt
    jwt = None


def _part(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def header_of(token: str) -> Dict[str, Any]:
    return json.loads(_part(token.split(".")[0]))


def verified(token: str, jwks: Dict[str, Any]) -> Dict[str, Any]:
    """The claims of ``token`` once its RS256 signature is checked by the JWKS key its kid names."""
    if jwt is not None:
        try:
            return jwt.decode(token, KeySet.import_key_set(jwks), algorithms=["RS256"]).claims
        except JoseError as error:
            raise InvalidSignature(str(error)) from error
    header, payload, signature = token.split(".")
    assert header_of(token)["alg"] == "RS256"
    [key] = [key for key in jwks["keys"] if key["kid"] == header_of(token)["kid"]]
    numbers = RSAPublicNumbers(*(int.from_bytes(_part(key[name]), "big") for name in ("e", "n")))
    message = f"{header}.{payload}".encode()
    numbers.public_key().verify(_part(signature), message, padding.PKCS1v15(), hashes.SHA256())
    return json.loads(_part(payload))


def signed(provider: OidcProvider) -> Tuple[str, str]:
    """A new token of alice's and the kid that signed it."""
    token = provider.token("alice")
    return token, header_of(token)["kid"]


def test_discovery_names_the_issuer_on_its_own_port(oidc_provider: OidcProvider) -> None:
    discovery = oidc_provider.discovery
    assert discovery["issuer"] == oidc_provider.issuer == f"http://127.0.0.1:{oidc_provider.port}"
    assert oidc_provider.jwks_uri == f"{oidc_provider.issuer}/jwks"
    assert discovery["token_endpoint"].startswith(oidc_provider.issuer + "/")
    assert "client_credentials" in discovery["grant_types_supported"]
    assert discovery["code_challenge_methods_supported"] == ["S256"]


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_a_user_token_is_an_at_jwt_for_that_user(oidc_provider: OidcProvider, user: str) -> None:
    token = oidc_provider.token(user, scope="read:notes write:notes")
    header = header_of(token)
    assert (header["alg"], header["typ"]) == ("RS256", "at+jwt")
    assert header["kid"] in [key["kid"] for key in oidc_provider.jwks()["keys"]]
    claims = verified(token, oidc_provider.jwks())
    assert claims["iss"] == oidc_provider.issuer
    assert (claims["aud"], claims["sub"], claims["client_id"]) == ("jetway", user, USER_CLIENT)
    assert claims["scope"].split() == ["read:notes", "write:notes"]
    assert claims["iat"] <= time.time() + 5 < claims["exp"]


def test_the_audience_and_scopes_are_the_callers(oidc_provider: OidcProvider) -> None:
    claims = verified(oidc_provider.token("bob", scope="read:orders admin", audience="other"), oidc_provider.jwks())
    assert (claims["aud"], sorted(claims["scope"].split())) == ("other", ["admin", "read:orders"])


def test_a_service_token_is_the_svc_clients(oidc_provider: OidcProvider) -> None:
    token = oidc_provider.service_token(scope="read:*")
    assert header_of(token)["typ"] == "at+jwt"
    claims = verified(token, oidc_provider.jwks())
    assert (claims["sub"], claims["client_id"], claims["aud"], claims["scope"]) == (
        SERVICE_CLIENT,
        SERVICE_CLIENT,
        "jetway",
        "read:*",
    )


def test_a_service_token_may_carry_no_scope(oidc_provider: OidcProvider) -> None:
    assert "scope" not in verified(oidc_provider.service_token(scope=""), oidc_provider.jwks())


def test_a_changed_claim_fails_the_signature(oidc_provider: OidcProvider) -> None:
    """The check the other tests lean on is not vacuous."""
    header, payload, signature = oidc_provider.token("alice").split(".")
    claims = {**json.loads(_part(payload)), "sub": "bob"}
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(InvalidSignature):
        verified(f"{header}.{forged}.{signature}", oidc_provider.jwks())


def test_an_unknown_user_is_refused(oidc_provider: OidcProvider) -> None:
    with pytest.raises(ProviderError, match="no such user: carol"):
        oidc_provider.token("carol")


def test_an_unknown_scope_is_an_error_not_a_narrower_token(oidc_provider: OidcProvider) -> None:
    with pytest.raises(ProviderError, match="read:nope"):
        oidc_provider.token("alice", scope="read:notes read:nope")
    with pytest.raises(ProviderError, match="read:nope"):
        oidc_provider.service_token(scope="read:nope")


def test_a_two_second_token_has_expired_three_seconds_later(oidc_provider: OidcProvider) -> None:
    claims = verified(oidc_provider.token("alice", lifetime=2), oidc_provider.jwks())
    assert claims["exp"] - claims["iat"] == 2
    time.sleep(3)
    assert claims["exp"] < time.time()
    if jwt is not None:
        with pytest.raises(JoseError):
            jwt.JWTClaimsRegistry(leeway=0, exp={"essential": True}).validate(claims)


def test_rotation_moves_signing_to_the_new_key_in_three_phases(tmp_path: Path) -> None:
    """Added: the old key signs; promoted: the new one does, the old still verifies; dropped: it is gone."""
    with OidcProvider(tmp_path) as provider:
        port = provider.port
        old_token, old = signed(provider)
        assert provider.kids() == [old]

        new = provider.rotate_add()
        assert provider.kids() == [old, new] == [key["kid"] for key in provider.jwks()["keys"]]
        assert signed(provider)[1] == old

        provider.rotate_promote()
        assert provider.kids() == [new, old] == [key["kid"] for key in provider.jwks()["keys"]]
        token, kid = signed(provider)
        assert kid == new
        assert verified(token, provider.jwks())["sub"] == verified(old_token, provider.jwks())["sub"] == "alice"

        provider.rotate_drop_old()
        assert provider.kids() == [new] == [key["kid"] for key in provider.jwks()["keys"]]
        assert signed(provider)[1] == new
        assert (provider.port, provider.discovery["issuer"]) == (port, f"http://127.0.0.1:{port}")
        process = provider.process
    assert process is not None and process.poll() is not None
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
