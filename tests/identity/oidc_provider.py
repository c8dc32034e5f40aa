"""The suite's OpenID Connect provider: node-oidc-provider 8.8.1 as a real process.

``OidcProvider`` runs ``tests/identity/provider/provider.js`` (its packages:
``make identity-packages``, part of ``make test``) on a free port of
127.0.0.1 chosen before the start, since the issuer URL carries it, and stops
it by its pid however the ``with`` block ends. Its access tokens are JWTs
(RFC 9068: ``typ`` at+jwt, RS256) for an audience of the caller's choosing
(``jetway`` by default) and a lifetime in whole seconds, so a test can watch
one expire.

User tokens come from the real authorization-code flow with PKCE, driven over
HTTP with a fresh cookie jar per token: ``/auth`` with ``login_hint`` and a
resource indicator, the provider's own interaction (provider.js logs in the
user named, if it is one of ``users``, and consents to what was asked), then
``/token`` with the code verifier; about six requests. Service tokens are
client_credentials for the client ``svc`` (their ``sub`` is ``svc``). The
provider drops a scope it does not know without a word; here that is an
error, so a typo cannot pass for a narrower token: ``scopes`` lists those
known (by default Jetway's for the collections notes, orders and profiles).
A user token needs one scope at least (the provider refuses a grant of
none); a service token may have none.

Keys rotate the way oidc-provider documents (its ``jwks`` option: the first
key signs, every key is published): ``rotate_add`` appends a new key,
``rotate_promote`` moves it first, ``rotate_drop_old`` keeps only it, each
restarting the process on the same port with the new list of key ids
(provider.js makes a kid's key the first time it is named). Only the
standard library speaks HTTP here, never through a proxy, and only to the
provider on 127.0.0.1.
"""

from __future__ import annotations

import base64
import hashlib
import http.cookiejar
import json
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from tests.support import free_port, stop_process

PROVIDER = Path(__file__).resolve().parent / "provider"
USERS = ("alice", "bob")
COLLECTIONS = ("notes", "orders", "profiles")
SCOPES = ("admin", "read:*", "write:*", *(f"{verb}:{name}" for name in COLLECTIONS for verb in ("read", "write")))
DEFAULT_SCOPE = "read:notes write:notes"
USER_CLIENT = "jetway-web"
SERVICE_CLIENT = "svc"
# Never fetched: the flow stops at the redirect that names it.
REDIRECT_URI = "http://127.0.0.1/callback"
RESOURCE = "urn:jetway:api"
# Generous: two shared cores, and node starts in 0.5-2 s on them.
START_TIMEOUT = 60.0
HTTP_TIMEOUT = 30.0
MAX_REDIRECTS = 10


class ProviderError(RuntimeError):
    """The provider refused a request, or granted less than was asked."""


class OidcProvider:
    """node-oidc-provider on 127.0.0.1, its config, keys and log in ``directory``."""

    def __init__(self, directory: Path, scopes: Sequence[str] = SCOPES, users: Sequence[str] = USERS) -> None:
        self.directory = directory
        self.scopes = tuple(scopes)
        self.users = tuple(users)
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "oidc-provider.log"
        self.discovery: Dict[str, Any] = {}
        self.process: Optional[subprocess.Popen] = None
        self._secret = secrets.token_urlsafe(24)
        self._kids: List[str] = []
        self._made_keys = 0

    def __enter__(self) -> OidcProvider:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def jwks_uri(self) -> str:
        return self.discovery["jwks_uri"]

    def start(self) -> OidcProvider:
        """Write the config, start with a first key, and wait for discovery; stopped again if that fails."""
        if not (PROVIDER / "node_modules" / "oidc-provider").is_dir():
            raise RuntimeError(f"no oidc-provider in {PROVIDER}/node_modules: run `make identity-packages`")
        (self.directory / "keys").mkdir(parents=True, exist_ok=True)
        (self.directory / "config.json").write_text(json.dumps(self._config()))
        if not self._kids:
            self._kids = [self._new_kid()]
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None

    def kids(self) -> List[str]:
        """The key ids the provider holds, the signing one first."""
        return list(self._kids)

    def jwks(self) -> Dict[str, Any]:
        """The JWKS as published now."""
        with _opener().open(self.jwks_uri, timeout=HTTP_TIMEOUT) as response:
            return json.loads(response.read())

    def rotate_add(self) -> str:
        """Phase 1: publish a new key beside the signing one (which still signs); its kid."""
        self._kids = [*self._kids, self._new_kid()]
        self._restart()
        return self._kids[-1]

    def rotate_promote(self) -> None:
        """Phase 2: the newest key signs; the others stay published for the tokens they signed."""
        self._kids = [self._kids[-1], *self._kids[:-1]]
        self._restart()

    def rotate_drop_old(self) -> None:
        """Phase 3 (once the old keys' tokens have expired): publish the signing key alone."""
        self._kids = self._kids[:1]
        self._restart()

    def rotate(self) -> str:
        """The three phases at once, for a test that wants a rotated provider; the new kid."""
        kid = self.rotate_add()
        self.rotate_promote()
        self.rotate_drop_old()
        return kid

    def token(self, user: str, scope: str = DEFAULT_SCOPE, audience: str = "jetway", lifetime: int = 3600) -> str:
        """An access token for ``user`` (its ``sub``), by the authorization-code flow with PKCE."""
        self._check_known(scope)
        opener = _opener(http.cookiejar.CookieJar())
        verifier = secrets.token_urlsafe(48)
        state = secrets.token_urlsafe(16)
        resource = self._resource(audience, lifetime)
        query = {
            "client_id": USER_CLIENT,
            "response_type": "code",
            "redirect_uri": REDIRECT_URI,
            "scope": scope,
            "resource": resource,
            "login_hint": user,
            "state": state,
            "code_challenge": _b64url(hashlib.sha256(verifier.encode()).digest()),
            "code_challenge_method": "S256",
        }
        answer = self._authorize(opener, f"{self.discovery['authorization_endpoint']}?{urllib.parse.urlencode(query)}")
        if "error" in answer or answer.get("state") != state:
            raise ProviderError(f"authorization for {user!r} failed: {answer}")
        form = {
            "grant_type": "authorization_code",
            "code": answer["code"],
            "redirect_uri": REDIRECT_URI,
            "client_id": USER_CLIENT,
            "code_verifier": verifier,
            "resource": resource,
        }
        return self._access_token(opener, form, {}, scope)

    def service_token(self, scope: str = DEFAULT_SCOPE, audience: str = "jetway", lifetime: int = 3600) -> str:
        """An access token for the service client ``svc`` (its ``sub``), by client_credentials."""
        self._check_known(scope)
        form = {"grant_type": "client_credentials", "scope": scope, "resource": self._resource(audience, lifetime)}
        basic = _b64(f"{SERVICE_CLIENT}:{self._secret}".encode())
        return self._access_token(_opener(), form, {"Authorization": f"Basic {basic}"}, scope)

    def _config(self) -> Dict[str, Any]:
        return {
            "port": self.port,
            "issuer": self.issuer,
            "kids_file": str(self.directory / "kids.json"),
            "keys_dir": str(self.directory / "keys"),
            "scopes": list(self.scopes),
            "users": list(self.users),
            "user_client": USER_CLIENT,
            "service_client": SERVICE_CLIENT,
            "service_secret": self._secret,
            "redirect_uri": REDIRECT_URI,
        }

    def _new_kid(self) -> str:
        """A kid never named before: provider.js makes its key when it first reads it."""
        self._made_keys += 1
        return f"key-{self._made_keys}"

    def _restart(self) -> None:
        self.stop()
        self._launch()

    def _launch(self) -> None:
        """Start node with the current kids on ``port`` and wait until discovery answers."""
        (self.directory / "kids.json").write_text(json.dumps(self._kids))
        command = [_node(), "provider.js", str(self.directory / "config.json")]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, cwd=PROVIDER, stdout=log, stderr=subprocess.STDOUT)
        self.discovery = self._discovered()
        if self.discovery.get("issuer") != self.issuer:
            raise ProviderError(f"discovery names the issuer {self.discovery.get('issuer')!r}, not {self.issuer!r}")

    def _discovered(self) -> Dict[str, Any]:
        url = f"{self.issuer}/.well-known/openid-configuration"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"oidc-provider exited; see {self.log_path}")
            try:
                return json.loads(_opener().open(url, timeout=HTTP_TIMEOUT).read())
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {url} after {START_TIMEOUT:g}s; see {self.log_path}") from None
                time.sleep(0.05)

    def _check_known(self, scope: str) -> None:
        unknown = set(scope.split()) - set(self.scopes)
        if unknown:
            raise ProviderError(f"scopes {sorted(unknown)} are not among the provider's {self.scopes}")

    def _resource(self, audience: str, lifetime: int) -> str:
        return f"{RESOURCE}?{urllib.parse.urlencode({'audience': audience, 'lifetime': lifetime})}"

    def _authorize(self, opener: urllib.request.OpenerDirector, url: str) -> Dict[str, str]:
        """Follow the provider's redirects to ``REDIRECT_URI``; the parameters it carries."""
        for _ in range(MAX_REDIRECTS):
            with opener.open(url, timeout=HTTP_TIMEOUT) as response:
                location = response.headers.get("Location")
                if location is None:
                    raise ProviderError(f"{url} answered {response.status} without a redirect: {response.read()!r}")
            url = urllib.parse.urljoin(url, location)
            if url.startswith(REDIRECT_URI + "?"):
                return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
        raise ProviderError(f"over {MAX_REDIRECTS} redirects, the last to {url}")

    def _access_token(
        self, opener: urllib.request.OpenerDirector, form: Dict[str, str], headers: Dict[str, str], scope: str
    ) -> str:
        """POST to the token endpoint; the access token, if it has every scope asked."""
        body = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.discovery["token_endpoint"], body, headers)
        try:
            with opener.open(request, timeout=HTTP_TIMEOUT) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise ProviderError(f"token endpoint: {error.code} {error.read()!r}") from None
        missing = set(scope.split()) - set(answer.get("scope", "").split())
        if missing:
            raise ProviderError(f"the provider dropped {sorted(missing)} (known: {self.scopes})")
        return answer["access_token"]


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is the answer: the authorization flow reads each one's Location."""

    def http_error_302(self, req, fp, code, msg, headers):
        return fp

    http_error_303 = http_error_302


def _opener(cookies: Optional[http.cookiejar.CookieJar] = None) -> urllib.request.OpenerDirector:
    """urllib with no proxy (only 127.0.0.1 is ever asked) and redirects left to the caller."""
    handlers = [urllib.request.ProxyHandler({}), _KeepRedirects()]
    if cookies is not None:
        handlers.append(urllib.request.HTTPCookieProcessor(cookies))
    return urllib.request.build_opener(*handlers)


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("no node on PATH: run `make identity-packages`")
    return node


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
