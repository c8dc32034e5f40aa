"""OpenID Connect bearer tokens end to end: node-oidc-provider's JWTs against a real Jetway and Redis.

The session's provider (``tests/identity/conftest.py``) issues alice's,
bob's and the service client's tokens; Jetway is configured with it as its
one issuer (``JETWAY_OIDC_ISSUERS``, no leeway, keys refreshed each second).
The attack cases are tokens made here: with the provider's own private key
(its key files), with a key of our own, or with none; each is a 401 and
nothing is fetched from where a header points.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import requests
from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.identity.oidc_provider import OidcProvider
from tests.sse_client import SseClient
from tests.support import JetwayServer, free_port

REFRESH_SECONDS = 1


def issuers_file(directory: Path, issuer: str, **members: Any) -> Path:
    path = directory / "issuers.json"
    entry = {"issuer": issuer, "audience": "jetway", "leeway_seconds": 0, "refresh_seconds": REFRESH_SECONDS}
    path.write_text(json.dumps({"issuers": [{**entry, **members}]}))
    return path


def serve(redis_url: str, directory: Path, issuers: Path, *args: str) -> JetwayServer:
    env = {"JETWAY_OIDC_ISSUERS": str(issuers)}
    return JetwayServer(redis_url, directory / "jetway.log", env, auth=True).start(["--workers", "1", *args])


@pytest.fixture(scope="module")
def server(redis_server, oidc_provider: OidcProvider, tmp_path_factory) -> Iterator[JetwayServer]:
    directory = tmp_path_factory.mktemp("jwt-bearer")
    jetway = serve(redis_server.url, directory, issuers_file(directory, oidc_provider.issuer))
    try:
        yield jetway
    finally:
        jetway.stop()


@pytest.fixture
def fresh(server, redis_client) -> JetwayServer:
    return server


def bearer(token: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def put(server: JetwayServer, path: str, token: str, body: bytes = b'{"v":1}') -> requests.Response:
    return requests.put(server.url(path), data=body, headers=bearer(token), timeout=10)


def get(server: JetwayServer, path: str, token: str) -> requests.Response:
    return requests.get(server.url(path), headers=bearer(token), timeout=10)


def signing_key(provider: OidcProvider) -> RSAKey:
    """The provider's signing key, private half and all (its key file): to sign claims of our choosing."""
    kid = provider.kids()[0]
    values = json.loads((provider.directory / "keys" / f"{kid}.json").read_text())
    values.pop("alg", None)  # so that joserfc lets the tests sign with it by another algorithm (RS512)
    return RSAKey.import_key(values)


def claims(provider: OidcProvider, **changes: Any) -> Dict[str, Any]:
    now = int(time.time())
    values = {"iss": provider.issuer, "aud": "jetway", "sub": "alice", "iat": now, "exp": now + 600}
    values["scope"] = "read:notes write:notes"
    values.update(changes)
    return {name: value for name, value in values.items() if value is not None}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256(header: Dict[str, Any], payload: Dict[str, Any], secret: bytes) -> str:
    """An HMAC-signed token with ``secret`` (joserfc itself refuses to use a public key as an HMAC secret)."""
    signing_input = ".".join([b64(json.dumps(header).encode()), b64(json.dumps(payload).encode())])
    return signing_input + "." + b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())


def hand_made(header: Dict[str, Any], payload: Dict[str, Any], signature: bytes = b"") -> str:
    return ".".join([b64(json.dumps(header).encode()), b64(json.dumps(payload).encode()), b64(signature)])


def test_a_users_token_reads_and_writes_what_its_scopes_allow(fresh, oidc_provider):
    alice = oidc_provider.token("alice", "read:notes write:notes")
    assert put(fresh, "/v1/notes/a", alice).status_code == 201
    read = get(fresh, "/v1/notes/a", alice)
    assert read.status_code == 200 and read.json() == {"v": 1}
    assert get(fresh, "/v1/orders/a", alice).status_code == 403
    reader = oidc_provider.token("bob", "read:notes")
    assert get(fresh, "/v1/notes/a", reader).status_code == 200
    refused = put(fresh, "/v1/notes/b", reader)
    assert refused.status_code == 403 and refused.json()["type"].endswith("forbidden")
    service = oidc_provider.service_token("read:*")
    assert get(fresh, "/v1/notes/a", service).status_code == 200
    assert get(fresh, "/v1/orders/a", service).status_code == 404  # read:* reaches every collection


def test_a_token_without_a_scope_grants_nothing(fresh, oidc_provider):
    assert get(fresh, "/v1/notes/a", oidc_provider.service_token("")).status_code == 403


class Counting(BaseHTTPRequestHandler):
    """A server a header points at: every request it gets is counted (there must be none)."""

    hits: List[str] = []

    def do_GET(self) -> None:
        Counting.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"keys":[]}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def elsewhere() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", free_port()), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Counting.hits.clear()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def attacks(provider: OidcProvider, elsewhere: str) -> Dict[str, str]:
    """Each a token Jetway must refuse, by what is wrong with it."""
    key = signing_key(provider)
    kid = provider.kids()[0]
    ours = RSAKey.generate_key(2048, {"kid": kid})
    public_pem = key.as_pem(private=False)
    good = claims(provider)
    jwk_header = {"alg": "RS256", "kid": kid, "jwk": ours.as_dict(private=False)}
    return {
        "alg none": hand_made({"alg": "none", "kid": kid}, good),
        "alg None": hand_made({"alg": "None", "kid": kid}, good),
        "HS256 keyed with the public key's PEM": hs256({"alg": "HS256", "kid": kid}, good, public_pem),
        "HS256 keyed with the public JWK's n": hs256(
            {"alg": "HS256", "kid": kid}, good, key.as_dict(private=False)["n"].encode()
        ),
        "signed by our key under the provider's kid": jwt.encode({"alg": "RS256", "kid": kid}, good, ours),
        "kid naming a path": jwt.encode({"alg": "RS256", "kid": "../../../etc/passwd"}, good, key),
        "jku pointing elsewhere": jwt.encode({"alg": "RS256", "kid": kid, "jku": elsewhere + "/jwks"}, good, key),
        "x5u pointing elsewhere": jwt.encode({"alg": "RS256", "kid": kid, "x5u": elsewhere + "/cert"}, good, key),
        "our key in a jwk header": jwt.encode(jwk_header, good, ours),
        "x5c certificate": jwt.encode({"alg": "RS256", "kid": kid, "x5c": ["MIIB"]}, good, key),
        "expired": jwt.encode({"alg": "RS256", "kid": kid}, claims(provider, exp=int(time.time()) - 5), key),
        "not yet valid": jwt.encode({"alg": "RS256", "kid": kid}, claims(provider, nbf=int(time.time()) + 300), key),
        "issued in the future": jwt.encode(
            {"alg": "RS256", "kid": kid}, claims(provider, iat=int(time.time()) + 300), key
        ),
        "no exp": jwt.encode({"alg": "RS256", "kid": kid}, claims(provider, exp=None), key),
        "wrong aud": jwt.encode({"alg": "RS256", "kid": kid}, claims(provider, aud="someone-else"), key),
        "wrong iss": jwt.encode({"alg": "RS256", "kid": kid}, claims(provider, iss=provider.issuer + "/x"), key),
        "unconfigured issuer": jwt.encode({"alg": "RS256", "kid": kid}, claims(provider, iss=elsewhere), key),
        "RS512 by the right key, not allowed": jwt.encode(
            {"alg": "RS512", "kid": kid}, good, key, algorithms=["RS512"]
        ),
        "payload changed after signing": resigned_as(jwt.encode({"alg": "RS256", "kid": kid}, good, key), "bob"),
        "the provider's token for another audience": provider.token("alice", audience="other"),
    }


def resigned_as(token: str, subject: str) -> str:
    """``token`` with its payload's ``sub`` changed and its signature kept."""
    header, payload, signature = token.split(".")
    changed = json.loads(base64.urlsafe_b64decode(payload + "==="))
    return ".".join([header, b64(json.dumps({**changed, "sub": subject}).encode()), signature])


def test_every_attack_token_is_refused_with_401_and_nothing_is_fetched(fresh, oidc_provider, elsewhere):
    control = jwt.encode(
        {"alg": "RS256", "kid": oidc_provider.kids()[0]}, claims(oidc_provider), signing_key(oidc_provider)
    )
    assert get(fresh, "/v1/notes/none", control).status_code == 404  # the same key and claims, unharmed: let in
    answers = {name: get(fresh, "/v1/notes/none", token) for name, token in attacks(oidc_provider, elsewhere).items()}
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == dict.fromkeys(answers, 401), statuses
    details = {answer.json()["detail"] for answer in answers.values()}
    assert details == {"the token is not valid"}  # one answer for every reason: nothing to learn from it
    assert all(answer.headers["WWW-Authenticate"].startswith("Bearer") for answer in answers.values())
    assert Counting.hits == []


def test_a_token_expires_on_its_exp(fresh, oidc_provider):
    alice = oidc_provider.token("alice", lifetime=2)
    assert get(fresh, "/v1/notes/x", alice).status_code == 404  # admitted (and its claims kept)
    time.sleep(2.5)
    assert get(fresh, "/v1/notes/x", alice).status_code == 401


def test_a_stream_opened_with_a_jwt_ends_when_it_expires(fresh, oidc_provider):
    alice = oidc_provider.token("alice", lifetime=3)
    expires = json.loads(base64.urlsafe_b64decode(alice.split(".")[1] + "==="))["exp"]
    stream = SseClient(fresh.port, "/v1/_changes/notes", {"Authorization": f"Bearer {alice}"})
    try:
        assert stream.response.status == 200
        assert stream.next_event().name == "ready"
        event = stream.next_event(timeout=10)
        ended_at = time.time()
        assert event is not None and event.name == "unauthorized", event
        assert event.json()["reason"] == "token-expired"
        assert -0.05 <= ended_at - expires < 1.5
    finally:
        stream.close()


def test_a_jwts_ticket_outlives_neither_the_token_nor_its_own_lifetime(fresh, oidc_provider):
    """A ticket for a JWT of 3 s expires with the token (the server's ticket lifetime is an hour), and the
    stream it opened ends then; a ticket is read-only: no write through it."""
    alice = oidc_provider.token("alice", "read:notes write:notes", lifetime=3)
    exp = json.loads(base64.urlsafe_b64decode(alice.split(".")[1] + "==="))["exp"]
    issued = requests.post(fresh.url("/v1/_changes/notes/tickets"), headers=bearer(alice), timeout=10)
    assert issued.status_code == 201, issued.text
    body = issued.json()
    expires = datetime.strptime(body["expires_at"] + "+0000", "%Y-%m-%dT%H:%M:%SZ%z").timestamp()
    assert expires <= exp
    stream = SseClient(fresh.port, f"/v1/_changes/notes?ticket={body['ticket']}", {})
    try:
        assert stream.response.status == 200
        assert stream.next_event().name == "ready"
        event = stream.next_event(timeout=10)
        assert event is not None and event.name == "unauthorized", event
        assert time.time() - exp < 1.5
    finally:
        stream.close()
    again = requests.get(fresh.url(f"/v1/_changes/notes?ticket={body['ticket']}"), timeout=10)
    assert again.status_code == 401


@pytest.mark.slow
def test_keys_rotate_a_removed_key_stops_its_tokens_and_an_issuer_down_at_start_is_503(redis_server, tmp_path):
    """A provider of the test's own: down when Jetway starts (503, never a hang), then up; its keys rotated
    (a new key's tokens verify at once, by a fetch on their unknown kid); the old key dropped (its tokens,
    even those verified and kept, are refused once the JWKS is fetched again)."""
    with OidcProvider(tmp_path / "provider") as provider:
        old_token = provider.token("alice")
        provider.stop()
        jetway = serve(redis_server.url, tmp_path, issuers_file(tmp_path, provider.issuer))
        try:
            started = time.monotonic()
            down = get(jetway, "/v1/notes/a", old_token)
            assert down.status_code == 503 and int(down.headers["Retry-After"]) >= 1
            assert time.monotonic() - started < 10
            provider.start()
            deadline = time.monotonic() + 20
            while get(jetway, "/v1/notes/a", old_token).status_code != 404:
                assert time.monotonic() < deadline, "the issuer's keys were not fetched again once it was up"
                time.sleep(0.2)
            # The loop's own unknown-kid fetches spent each worker's budget for one (at most one a refresh
            # interval, cache.credentials.jwks): once it is back, the new kid's token must be let in at once.
            time.sleep(REFRESH_SECONDS * 1.5)
            provider.rotate_add()
            provider.rotate_promote()
            new_token = provider.token("bob")
            assert get(jetway, "/v1/notes/a", new_token).status_code == 404  # the new kid: fetched on the spot
            assert get(jetway, "/v1/notes/a", old_token).status_code == 404  # still published
            provider.rotate_drop_old()
            deadline = time.monotonic() + 20
            while get(jetway, "/v1/notes/a", old_token).status_code != 401:
                assert time.monotonic() < deadline, "a token of a removed key still let in"
                time.sleep(0.2)
            assert get(jetway, "/v1/notes/a", new_token).status_code == 404
        finally:
            jetway.stop()


class JwksRelay(BaseHTTPRequestHandler):
    """The issuer's JWKS, fetched from the provider for each request, and each request counted."""

    source = ""
    hits: List[float] = []

    def do_GET(self) -> None:
        JwksRelay.hits.append(time.monotonic())
        body = requests.get(JwksRelay.source, timeout=10).content
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_a_flood_of_unknown_kids_is_refused_and_fetches_the_jwks_a_bounded_number_of_times(
    redis_server, oidc_provider, tmp_path
):
    """300 tokens, each naming a kid of its own, signed by the provider's key: each a 401, and the JWKS
    (through a relay that counts) fetched at most twice per refresh interval: one for unknown kids, one due."""
    relay = HTTPServer(("127.0.0.1", free_port()), JwksRelay)
    JwksRelay.source, JwksRelay.hits = oidc_provider.jwks_uri, []
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    issuers = issuers_file(tmp_path, oidc_provider.issuer, jwks_uri=f"http://127.0.0.1:{relay.server_port}/jwks")
    jetway = serve(redis_server.url, tmp_path, issuers)
    try:
        key = signing_key(oidc_provider)
        assert (
            get(
                jetway,
                "/v1/notes/a",
                jwt.encode({"alg": "RS256", "kid": oidc_provider.kids()[0]}, claims(oidc_provider), key),
            ).status_code
            == 404
        )
        started, before = time.monotonic(), len(JwksRelay.hits)
        with requests.Session() as session:
            for number in range(300):
                token = jwt.encode({"alg": "RS256", "kid": f"unknown-{number}"}, claims(oidc_provider), key)
                session.headers.update(bearer(token))
                assert session.get(jetway.url("/v1/notes/a"), timeout=10).status_code == 401
        intervals = 1 + int((time.monotonic() - started) / REFRESH_SECONDS)
        assert len(JwksRelay.hits) - before <= 2 * intervals, (len(JwksRelay.hits) - before, intervals)
    finally:
        jetway.stop()
        relay.shutdown()
        relay.server_close()
