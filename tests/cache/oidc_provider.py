"""A small OpenID provider for the tests of cache.credentials' OIDC modules, and the runner of their scenarios.

The provider is a Twisted ``Site`` on 127.0.0.1 in the scenario's own
reactor: the discovery document, the JWKS, and on demand a path that never
answers, sends 10 MB, redirects or fails; every request is counted by path.
Keys and tokens are made with joserfc; attack tokens are put together by
hand (``forged``), as an attacker would.

A scenario is an ``async def scenario_<name>(reactor) -> dict`` of a test
module. ``run_scenarios(module)`` plays all of that module's scenarios in
one subprocess in the app's interpreter (a reactor runs once per process,
and a PyPy start costs ~2 s on this machine), each under its own deadline,
and returns each one's figures, or its traceback, by name.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from typing import Any, Callable, Dict, List, Optional

from joserfc import jwt
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey
from twisted.internet import defer, task
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from cache.credentials.issuers import Issuer
from cache.credentials.jwt_tokens import IssuerUnavailable, JwtRefused
from tests.support import ROOT

AUDIENCE = "jetway"
SCENARIO_SECONDS = 60.0
HUGE_BYTES = 10 * 1024 * 1024
DISCOVERY = "/realm/.well-known/openid-configuration"


def rsa_key(kid: str, bits: int = 2048) -> RSAKey:
    return RSAKey.generate_key(bits, {"kid": kid})


def ec_key(kid: str, curve: str = "P-256") -> ECKey:
    return ECKey.generate_key(curve, {"kid": kid})


def ed_key(kid: str) -> OKPKey:
    return OKPKey.generate_key("Ed25519", {"kid": kid})


def public_jwks(*keys: Key) -> Dict[str, Any]:
    return {"keys": [key.as_dict(private=False) for key in keys]}


def claims_for(issuer: str, **changes: Any) -> Dict[str, Any]:
    now = int(time.time())
    claims = {"iss": issuer, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 600, "scope": "read:orders"}
    claims.update(changes)
    return {name: value for name, value in claims.items() if value is not None}


def mint(key: Key, claims: Dict[str, Any], alg: str = "", **header: Any) -> str:
    """A token signed by ``key`` as its issuer would sign it (``kid`` the key's unless given)."""
    alg = alg or {"RSA": "RS256", "EC": "ES256", "OKP": "EdDSA"}[key.key_type]
    with warnings.catch_warnings():  # joserfc warns when signing with EdDSA (RFC 9864): not under test here
        warnings.simplefilter("ignore")
        return jwt.encode({"alg": alg, "kid": key.kid, **header}, claims, key, algorithms=[alg])


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged(header: Dict[str, Any], claims: Any, signature: bytes = b"forged", payload: Optional[bytes] = None) -> str:
    """A token put together by hand, with whatever header, claims and signature an attacker chooses."""
    body = payload if payload is not None else json.dumps(claims).encode()
    return f"{b64(json.dumps(header).encode())}.{b64(body)}.{b64(signature)}"


def hmac_signed(header: Dict[str, Any], claims: Dict[str, Any], secret: bytes) -> str:
    """An HS256 token signed with ``secret`` (the confusion attack's: the issuer's public key as the secret)."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


class Provider(Resource):
    """Discovery at ``/realm/.well-known/openid-configuration`` and the JWKS at ``/jwks``; requests counted by path.

    ``behaviour[path]``: ``silent`` (never answers), ``huge`` (10 MB, no
    length), ``huge-declared`` (10 MB with its Content-Length), ``redirect``
    (302 to ``/jwks-moved``), ``error`` (500).
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.requests: Counter = Counter()
        self.jwks: Any = {"keys": []}
        self.behaviour: Dict[str, str] = {}
        self.discovery: Dict[str, Any] = {}
        self.base = ""
        self.port: Any = None
        self.held: List[Any] = []

    @classmethod
    async def start(cls, reactor: Any, *keys: Key) -> Provider:
        provider = cls()
        provider.jwks = public_jwks(*keys)
        provider.port = reactor.listenTCP(0, Site(provider), interface="127.0.0.1")
        provider.base = f"http://127.0.0.1:{provider.port.getHost().port}"
        return provider

    @property
    def issuer(self) -> str:
        return self.base + "/realm"

    def config(self, **changes: Any) -> Issuer:
        values: Dict[str, Any] = {"issuer": self.issuer, "audience": AUDIENCE, "fetch_timeout_seconds": 5.0}
        values.update(changes)
        return Issuer(**values)

    def count(self, path: str) -> int:
        return self.requests[path]

    def render_GET(self, request: Any) -> Any:
        path = request.path.decode()
        self.requests[path] += 1
        behaviour = self.behaviour.get(path)
        if behaviour == "silent":
            self.held.append(request)
            return NOT_DONE_YET
        if behaviour in ("huge", "huge-declared"):
            if behaviour == "huge-declared":
                request.setHeader(b"content-length", str(HUGE_BYTES).encode())
            request.write(b'{"keys": [' + b" " * (HUGE_BYTES - 12) + b"]}")
            request.finish()
            return NOT_DONE_YET
        if behaviour == "redirect":
            request.setResponseCode(302)
            request.setHeader(b"location", (self.base + "/jwks-moved").encode())
            return b""
        if behaviour == "error":
            request.setResponseCode(500)
            return b"{}"
        if path == DISCOVERY:
            document = {"issuer": self.issuer, "jwks_uri": self.base + "/jwks", **self.discovery}
            return self._json(request, document)
        if path in ("/jwks", "/jwks-moved"):
            return self._json(request, self.jwks)
        request.setResponseCode(404)
        return b""

    @staticmethod
    def _json(request: Any, document: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(document).encode()

    async def stop(self) -> None:
        """Stop listening (later fetches are refused connections) and drop the requests held unanswered."""
        for request in self.held:
            request.loseConnection()
        self.held = []
        if self.port is not None:
            await self.port.stopListening()
            self.port = None


async def outcome(verifier: Any, token: str) -> str:
    """What the verifier made of ``token``: ``ok:<name>``, ``refused:<reason>`` or ``unavailable``."""
    try:
        record = await defer.maybeDeferred(verifier.verify, token)
    except JwtRefused as refused:
        return f"refused:{refused.reason}"
    except IssuerUnavailable:
        return "unavailable"
    return f"ok:{record.name}"


async def pause(reactor: Any, seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


async def until(reactor: Any, condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    waited = 0.0
    while not condition():
        if waited > timeout:
            raise AssertionError(f"waited {timeout} s for {what}")
        await pause(reactor, 0.01)
        waited += 0.01


def run_scenarios(module: str, env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Each ``scenario_<name>`` of ``module``'s figures by name, played in one subprocess (with ``env``'s variables)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.cache.oidc_provider", module],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def figures(scenarios: Dict[str, Any], name: str) -> Dict[str, Any]:
    """One scenario's figures; its traceback as the failure if it raised."""
    played = scenarios[name]
    assert "scenario_failed" not in played, played["scenario_failed"]
    return played


async def _play_all(reactor: Any, module_name: str) -> None:
    module = importlib.import_module(module_name)
    played: Dict[str, Any] = {}
    for name, scenario in vars(module).items():
        if not name.startswith("scenario_"):
            continue
        try:
            played[name[len("scenario_") :]] = await defer.ensureDeferred(scenario(reactor)).addTimeout(
                SCENARIO_SECONDS, reactor
            )
        except Exception:
            played[name[len("scenario_") :]] = {"scenario_failed": traceback.format_exc()}
    print(json.dumps(played), flush=True)


def main(argv: List[str]) -> None:
    task.react(lambda reactor: defer.ensureDeferred(_play_all(reactor, argv[1])))


if __name__ == "__main__":
    main(sys.argv)
