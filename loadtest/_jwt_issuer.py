"""A local OpenID Connect issuer for load tests: keys made for the run, its discovery and JWKS served, tokens minted.

    .venv/bin/python loadtest/_jwt_issuer.py serve DIR     # until stopped (SIGTERM)
    .venv/bin/python loadtest/_jwt_issuer.py mint DIR [--sub bench-user]
        [--scope "read:bench write:bench"] [--alg RS256|ES256] [--count N]

``serve`` makes an RSA 2048 key (``RS256``) and an EC P-256 key (``ES256``),
listens on a free port of 127.0.0.1 and writes into DIR ``keys.json`` (the
private keys and the issuer's URL, for ``mint``) and ``issuers.json`` (a
``JETWAY_OIDC_ISSUERS`` file naming this issuer, audience ``jetway``, keys
refreshed once a day), the latter last: once it exists the issuer answers
``/.well-known/openid-configuration`` and ``/jwks.json``. ``mint`` prints
tokens, one a line: ``iss`` this issuer, ``aud`` jetway, ``sub`` and
``scope`` as given, a day to live, and each its own ``jti`` (so each is a
new token to Jetway, whose claims cache is by the token's digest).

Runs on the project's PyPy (``.venv``: joserfc). Used by ``loadtest/ab_cpu.sh``
(``AUTH_A``/``AUTH_B=jwt``) and ``loadtest/studies/_identity_cost.py``; never
imported by the app.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List

from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

AUDIENCE = "jetway"
KIDS = {"RS256": "bench-rsa", "ES256": "bench-ec"}
LIFETIME = 86_400


class Issuer:
    """Discovery and JWKS served from a thread; ``directory`` holds ``keys.json`` and ``issuers.json``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.keys = {
            "RS256": RSAKey.generate_key(2048, {"kid": KIDS["RS256"]}),
            "ES256": ECKey.generate_key("P-256", {"kid": KIDS["ES256"]}),
        }
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's hook
                documents = {
                    "/.well-known/openid-configuration": {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks.json"},
                    "/jwks.json": {"keys": [key.as_dict(private=False) for key in issuer.keys.values()]},
                }
                if self.path not in documents:
                    self.send_error(404)
                    return
                body = json.dumps(documents[self.path]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler

    def start(self) -> Issuer:
        self._thread.start()
        self.directory.mkdir(parents=True, exist_ok=True)
        private = {alg: key.as_dict(private=True) for alg, key in self.keys.items()}
        (self.directory / "keys.json").write_text(json.dumps({"issuer": self.url, "keys": private}))
        entry = {"issuer": self.url, "audience": AUDIENCE, "refresh_seconds": LIFETIME}
        (self.directory / "issuers.json").write_text(json.dumps({"issuers": [entry]}))
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def mint(directory: Path, sub: str, scope: str, alg: str = "RS256", count: int = 1) -> Iterator[str]:
    """``count`` tokens of the issuer whose ``keys.json`` is in ``directory``."""
    saved = json.loads((directory / "keys.json").read_text())
    values = saved["keys"][alg]
    key = RSAKey.import_key(values) if alg == "RS256" else ECKey.import_key(values)
    now = int(time.time())
    claims: Dict[str, Any] = {"iss": saved["issuer"], "aud": AUDIENCE, "sub": sub, "scope": scope}
    claims.update(iat=now, exp=now + LIFETIME)
    for number in range(count):
        yield jwt.encode({"alg": alg, "kid": KIDS[alg], "typ": "JWT"}, {**claims, "jti": f"t{number:06d}"}, key)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve").add_argument("directory", type=Path)
    minting = commands.add_parser("mint")
    minting.add_argument("directory", type=Path)
    minting.add_argument("--sub", default="bench-user")
    minting.add_argument("--scope", default="read:bench write:bench")
    minting.add_argument("--alg", choices=sorted(KIDS), default="RS256")
    minting.add_argument("--count", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "mint":
        for token in mint(args.directory, args.sub, args.scope, args.alg, args.count):
            sys.stdout.write(token + "\n")
        return 0
    issuer = Issuer(args.directory).start()
    try:
        threading.Event().wait()  # until SIGTERM (Python's default: the process ends)
    finally:
        issuer.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
