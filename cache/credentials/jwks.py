"""An issuer's signing keys (its JWKS), fetched without blocking the reactor and kept fresh at a bounded rate.

Fetching: Twisted's ``Agent`` (redirects are not followed: a 3xx is a
failure), with a connect timeout and a deadline over the whole request
(``fetch_timeout_seconds``), and a body bound (``max_jwks_bytes``): a longer
body, by its Content-Length or as it arrives, stops the transport, so a
huge or endless answer costs at most the bound and one read. The JWKS URL is
the configured ``jwks_uri``, or the discovery document's (whose ``issuer``
must equal the configured one exactly, OpenID Connect Discovery section 4.3).

Which keys are kept: public keys (RSA of 2048 bits or more, EC, Ed25519 and
Ed448) with a ``kid``, that an allowed algorithm can use, whose ``use`` (if
any) is ``sig`` and whose ``key_ops`` (if any) include ``verify``. Dropped:
symmetric (``oct``) keys, keys carrying private members (a published private
key signs anything, so tokens under it prove nothing), and a ``kid`` named
twice (which one a token means cannot be told).

Consistency rule: the keys are those of the last JWKS fetched and parsed
successfully, replaced whole, so a key gone from it stops verifying at once;
a failed fetch keeps them (an unreachable issuer does not stop its current
tokens). A key whose JWK did not change keeps its ``Key`` object, which is
what a cached verification compares (``cache.credentials.jwt_tokens``).

When: ``start()`` fetches; every fetch that ends (well or not) schedules the
next ``refresh_seconds`` later, so a removed key stops its tokens within that
interval with no traffic at all. A token naming an unknown ``kid`` may start
a fetch at once, at most once per ``refresh_seconds`` (its own budget: the
periodic fetch cannot spend it, or a new key would wait a whole interval),
and every request that arrives while a fetch is in flight waits for that
one. So a flood of unknown kids costs the issuer at most one fetch per
interval, two with the periodic one. Time for these decisions is ``clock``'s
(the reactor in the app, a ``task.Clock`` in tests); network deadlines are
the reactor's.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from joserfc.errors import JoseError
from joserfc.jwk import Key, import_key
from twisted.internet import defer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, PotentialDataLoss, ResponseDone
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH

from cache.credentials.issuers import Issuer, url_problem
from cache.json.codec import JsonError, loads

_log = Logger()

# More keys than any provider publishes (rotation keeps two or three); each costs an import.
MAX_KEYS = 100
MAX_KID_LENGTH = 256
MIN_RSA_BITS = 2048
# Members only a private (or symmetric) JWK has (RFC 7518 section 6; RFC 8037 section 2).
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
KEY_TYPE_OF = {
    **{name: "RSA" for name in ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")},
    **{name: "EC" for name in ("ES256", "ES384", "ES512")},
    "EdDSA": "OKP",
}
SIGNING_CURVES = ("Ed25519", "Ed448")
_ACCEPT = Headers({b"Accept": [b"application/jwk-set+json, application/json"]})

Fetch = Callable[[str, int, float], defer.Deferred]
KeyEntries = Dict[str, Tuple[Dict[str, Any], Key]]


class JwksError(Exception):
    """A discovery document or JWKS that could not be fetched or used; the message says which and why."""


class HttpFetch:
    """GET a URL's body through ``Agent``: no redirect, a deadline, at most ``max_bytes``."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def __call__(self, url: str, max_bytes: int, timeout: float) -> defer.Deferred:
        """Fires with the body's bytes, or fails (``JwksError``, or the connection's error)."""
        agent = Agent(self._reactor, connectTimeout=timeout)
        return self._get(agent, url, max_bytes).addTimeout(timeout, self._reactor, _timed_out(url))

    @defer.inlineCallbacks
    def _get(self, agent: Agent, url: str, max_bytes: int) -> Any:
        response = yield agent.request(b"GET", url.encode("ascii"), _ACCEPT)
        if response.code != 200:
            _Bounded.discard(response)
            raise JwksError(f"{url} answered HTTP {response.code} (redirects are not followed)")
        if response.length is not UNKNOWN_LENGTH and response.length > max_bytes:
            _Bounded.discard(response)
            raise JwksError(f"{url} sends {response.length} bytes, over the bound of {max_bytes}")
        reading = _Bounded(url, max_bytes)
        response.deliverBody(reading)
        body = yield reading.done
        return body


def _timed_out(url: str) -> Callable[[Any, float], Any]:
    def say(_: Any, timeout: float) -> Any:
        # Agent reports its cancelled request as ResponseNeverReceived: say what happened instead.
        raise JwksError(f"{url}: no whole answer within {timeout:g} s")

    return say


class _Bounded(Protocol):
    """A response body, collected up to ``limit`` bytes; past it, the transport is stopped."""

    def __init__(self, url: str, limit: int) -> None:
        self.url = url
        self.limit = limit
        self.size = 0
        self.chunks: List[bytes] = []
        self.done: defer.Deferred = defer.Deferred(self._cancel)

    @classmethod
    def discard(cls, response: Any) -> None:
        """Read nothing of ``response``: its first byte stops the transport."""
        reading = cls("", 0)
        reading.done.addErrback(lambda _: None)
        response.deliverBody(reading)

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        self.size += len(data)
        if self.size > self.limit:
            self.chunks = []
            self.transport.stopProducing()  # IResponse.deliverBody: stops the body and closes the connection
            self.done.errback(JwksError(f"{self.url} sent more than {self.limit} bytes (stopped at {self.size})"))
            return
        self.chunks.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.done.called:
            return
        # PotentialDataLoss: a body ended by the connection's close (no length given);
        # the JSON parse that follows refuses a truncated one.
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self.chunks))
        else:
            self.done.errback(JwksError(f"{self.url}: the body was cut short ({reason.getErrorMessage()})"))
        self.chunks = []

    def _cancel(self, _: defer.Deferred) -> None:
        if self.transport is not None:
            self.transport.stopProducing()


def jwks_uri_of(body: bytes, issuer: Issuer) -> str:
    """The ``jwks_uri`` of a discovery document that belongs to ``issuer``; raises ``JwksError``."""
    document = _json(body, issuer.discovery_uri)
    if not isinstance(document, dict):
        raise JwksError(f"{issuer.discovery_uri}: not a JSON object")
    if document.get("issuer") != issuer.issuer:
        raise JwksError(
            f"{issuer.discovery_uri}: names issuer {str(document.get('issuer'))[:200]!r}, not {issuer.issuer!r}"
        )
    uri = document.get("jwks_uri")
    problem = url_problem(uri)
    if problem:
        raise JwksError(f"{issuer.discovery_uri}: jwks_uri {problem}")
    return uri


def public_keys(document: Any, algorithms: Tuple[str, ...]) -> Tuple[KeyEntries, List[str]]:
    """The usable keys of a parsed JWKS by ``kid`` (each with its JWK), and why each other key was dropped."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwksError('not a JWK set (an object with a "keys" list)')
    entries = document["keys"]
    if len(entries) > MAX_KEYS:
        raise JwksError(f"holds {len(entries)} keys, over {MAX_KEYS}")
    kept: KeyEntries = {}
    dropped: List[str] = []
    twice = set()
    for entry in entries:
        problem = _unusable(entry, algorithms)
        kid = entry.get("kid") if isinstance(entry, dict) else None
        if problem is None and (kid in kept or kid in twice):
            twice.add(kid)
            kept.pop(kid, None)
            problem = "its kid is named twice"
        if problem is None:
            key, problem = _imported(entry)
            if key is not None:
                kept[kid] = (entry, key)
        if problem is not None:
            dropped.append(f"{'key ' + repr(kid[:64]) if isinstance(kid, str) else 'a key without a kid'}: {problem}")
    return kept, dropped


def _unusable(entry: Any, algorithms: Tuple[str, ...]) -> Optional[str]:
    """Why a JWK is not kept, or None."""
    if not isinstance(entry, dict):
        return "not an object"
    kty = entry.get("kty")
    if kty == "oct":
        return "a symmetric (oct) key is never used"
    if any(member in entry for member in PRIVATE_MEMBERS):
        return "it carries private key members"
    # A string first: a list or object kty is no key type, and a set lookup of it would raise for the whole set.
    if not isinstance(kty, str) or kty not in {KEY_TYPE_OF[name] for name in algorithms}:
        return f"no allowed algorithm ({', '.join(algorithms)}) uses key type {str(kty)[:16]!r}"
    kid = entry.get("kid")
    if not isinstance(kid, str) or not 0 < len(kid) <= MAX_KID_LENGTH:
        return "no kid (a token must name its key)"
    if entry.get("use", "sig") != "sig":
        return "its use is not sig"
    key_ops = entry.get("key_ops")
    if key_ops is not None and (not isinstance(key_ops, list) or "verify" not in key_ops):
        return "its key_ops do not include verify"
    alg = entry.get("alg")
    if alg is not None and alg not in algorithms:
        return f"its alg {str(alg)[:16]!r} is not allowed"
    if kty == "OKP" and entry.get("crv") not in SIGNING_CURVES:
        return "an OKP key that is not Ed25519 or Ed448"
    return None


def _imported(entry: Dict[str, Any]) -> Tuple[Optional[Key], Optional[str]]:
    try:
        key = import_key(entry)
    except (JoseError, ValueError, TypeError, KeyError) as error:
        return None, f"cannot be read ({type(error).__name__}: {str(error)[:100]})"
    if entry["kty"] == "RSA" and key.public_key.key_size < MIN_RSA_BITS:
        return None, f"an RSA key under {MIN_RSA_BITS} bits"
    return key, None


def _json(body: bytes, url: str) -> Any:
    try:
        return loads(body)
    except JsonError as error:
        raise JwksError(f"{url}: not valid JSON ({error})") from None


class IssuerKeys:
    """One issuer's current keys by ``kid``, and the fetches that keep them (see the module's rule)."""

    def __init__(self, issuer: Issuer, reactor: Any, clock: Any = None, fetch: Optional[Fetch] = None) -> None:
        self.issuer = issuer
        self._clock = clock if clock is not None else reactor
        self._fetch: Fetch = fetch if fetch is not None else HttpFetch(reactor)
        self._entries: KeyEntries = {}
        self._keys: Dict[str, Key] = {}
        self._jwks_uri: Optional[str] = issuer.jwks_uri
        self._fetching: Optional[defer.Deferred] = None
        self._waiters: List[defer.Deferred] = []
        self._timer: Optional[Any] = None
        self._kid_fetch_at: Optional[float] = None
        self._stopped = False
        self.fetched = False  # a JWKS was installed once: tokens can be judged
        self.healthy = False  # the last fetch succeeded
        self.fetches = 0  # fetches started (each a discovery when needed, then the JWKS)
        self.last_error: Optional[str] = None
        self.dropped: List[str] = []  # why the last JWKS's other keys were not kept
        self._installed: List[Callable[[], None]] = []

    def on_install(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each JWKS installed (open streams check that their key is still in it)."""
        self._installed.append(listener)

    def key(self, kid: str) -> Optional[Key]:
        """The current key of that ``kid``, or None."""
        return self._keys.get(kid)

    @property
    def kids(self) -> Tuple[str, ...]:
        return tuple(self._keys)

    @property
    def fetching(self) -> bool:
        return self._fetching is not None

    def settled(self) -> defer.Deferred:
        """Fires (with None) once no fetch is in flight: at once if none is."""
        return self._wait()

    def start(self) -> defer.Deferred:
        """Fetch now (and every ``refresh_seconds`` after); fires once this first fetch ended, never fails."""
        self._stopped = False
        if self._fetching is None:
            self._begin()
        return self._wait()

    def stop(self) -> None:
        """No more fetches; one in flight is cancelled, and whoever waits for it hears it ended."""
        self._stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._fetching is not None:
            self._fetching.cancel()

    def refresh_for_unknown_kid(self) -> Optional[defer.Deferred]:
        """A Deferred that fires (with None) when a fetch that may know a new ``kid`` ended; None if none may start.

        The fetch in flight if there is one; else a new one, if no other
        was started for an unknown kid within ``refresh_seconds``.
        """
        if self._fetching is not None:
            return self._wait()
        now = self._clock.seconds()
        if self._stopped or (self._kid_fetch_at is not None and now - self._kid_fetch_at < self.issuer.refresh_seconds):
            return None
        self._kid_fetch_at = now
        self._begin()
        return self._wait()

    def load(self, document: Any) -> None:
        """Install a parsed JWKS, as a fetch does (a warm-up's own keys; tests)."""
        self._install(*public_keys(document, self.issuer.algorithms))

    def _begin(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self.fetches += 1
        fetching = self._fetch_keys()
        self._fetching = fetching
        fetching.addBoth(self._ended)  # may run at once (a fetch that answers synchronously)

    @defer.inlineCallbacks
    def _fetch_keys(self) -> Any:
        issuer = self.issuer
        if self._jwks_uri is None:
            body = yield self._fetch(issuer.discovery_uri, issuer.max_jwks_bytes, issuer.fetch_timeout_seconds)
            self._jwks_uri = jwks_uri_of(body, issuer)
        uri = self._jwks_uri
        try:
            body = yield self._fetch(uri, issuer.max_jwks_bytes, issuer.fetch_timeout_seconds)
            return public_keys(_json(body, uri), issuer.algorithms)
        except Exception:
            if issuer.jwks_uri is None:
                self._jwks_uri = None  # discover again next time: the provider may have moved its keys
            raise

    def _ended(self, result: Any) -> None:
        self._fetching = None
        if isinstance(result, Failure):
            self.healthy = False
            self.last_error = f"{type(result.value).__name__}: {result.getErrorMessage()}"[:500]
            if not self._stopped:
                _log.warn("OIDC keys of {issuer}: {error}", issuer=self.issuer.issuer, error=self.last_error)
        else:
            self._install(*result)
        if not self._stopped:
            self._timer = self._clock.callLater(self.issuer.refresh_seconds, self._periodic)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _install(self, entries: KeyEntries, dropped: List[str]) -> None:
        old = self._entries
        # An unchanged JWK keeps its Key object: cached verifications compare by identity.
        self._entries = {
            kid: old[kid] if old.get(kid, (None,))[0] == jwk else (jwk, key) for kid, (jwk, key) in entries.items()
        }
        self._keys = {kid: key for kid, (_, key) in self._entries.items()}
        self.fetched = self.healthy = True
        self.last_error = None
        self.dropped = dropped
        if not entries:
            _log.warn("OIDC keys of {issuer}: no usable key ({dropped})", issuer=self.issuer.issuer, dropped=dropped)
        for listener in self._installed:
            listener()

    def _periodic(self) -> None:
        self._timer = None
        if self._fetching is None and not self._stopped:
            self._begin()

    def _wait(self) -> defer.Deferred:
        if self._fetching is None:
            return defer.succeed(None)
        waiter: defer.Deferred = defer.Deferred(self._forget_waiter)
        self._waiters.append(waiter)
        return waiter

    def _forget_waiter(self, waiter: defer.Deferred) -> None:
        # A cancelled waiter (its client left) leaves the fetch running for the others.
        if waiter in self._waiters:
            self._waiters.remove(waiter)
