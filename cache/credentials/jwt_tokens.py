"""OpenID Connect bearer tokens (JWTs from the configured issuers): verified, mapped to grants, cached by digest.

A token is judged in this order, cheapest first, and any step refuses it
with ``JwtRefused`` (a 401; its reason is for logs, never for the client):

1. its shape (three base64url segments within joserfc's bounds: header 512
   bytes, payload 8,000, signature 1,024) and a header without ``jwk``,
   ``jku``, ``x5u``, ``x5c``, ``crit`` or ``b64``. A key or a key's address in
   the token is the attacker's choice; Jetway never fetches or trusts one, and
   a token that offers one is refused outright rather than read around;
2. its claims, read with Jetway's one strict JSON reader; the *unverified*
   ``iss`` only selects which configured issuer's settings and keys judge it
   (an unconfigured one is refused); then ``alg`` in that issuer's allow-list
   (asymmetric only: ``cache.credentials.issuers``), a ``kid``, ``typ`` if
   present ``JWT`` or ``at+jwt`` (RFC 9068), ``aud`` holding the audience,
   ``exp`` required, ``nbf`` and ``iat`` if present, each with the leeway,
   and a non-empty subject. These are plain comparisons, written here so a
   boolean is not taken for a time (as joserfc's registry would);
3. the signature, by joserfc with the key of that ``kid`` among that
   issuer's keys only (a kid naming another issuer's key, or a path, is just
   unknown; joserfc ties the key's type to the algorithm). An unknown kid
   waits for a fetch of the JWKS when one may run (``cache.credentials.jwks``);
   an issuer whose keys were never fetched is ``IssuerUnavailable`` (503).

Consistency rule of the claims cache: a verified token is kept by its
digest, at most ``max_cached`` of them, until ``exp`` plus the leeway. A
hit pays no signature check, but is refused (and dropped) once expired or
once the key that signed it is no longer the issuer's key of that kid, so a
key removed from the JWKS stops its cached tokens at the next refresh.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from joserfc import jwt
from joserfc.errors import JoseError, UnsupportedAlgorithmError
from joserfc.jwk import ECKey, Key, RSAKey
from joserfc.jws import CompactSignature, JWSAlgModel, JWSRegistry, extract_compact, validate_compact
from twisted.internet import defer, task

from cache.credentials.identity import Identity
from cache.credentials.issuers import Issuer
from cache.credentials.jwks import Fetch, IssuerKeys, JwksError
from cache.credentials.tokens import SCOPE_PATTERN, TokenRecord, digest_of
from cache.fill_guard import keep_bounded
from cache.json.codec import JsonError, loads

MAX_CACHED = 10_000
REFUSED_HEADERS = ("jwk", "jku", "x5u", "x5c", "crit", "b64")
TOKEN_TYPES = ("jwt", "application/jwt", "at+jwt", "application/at+jwt")
MAX_KID_LENGTH = 256
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+\Z")


class JwtRefused(Exception):
    """The token is not accepted (a 401, worded as for any invalid token); ``reason`` says why, for logs."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IssuerUnavailable(Exception):
    """The token's issuer has no keys Jetway could fetch yet, or its JWKS cannot be reached (a 503)."""

    def __init__(self, issuer: str, retry_after: int, detail: str) -> None:
        super().__init__(f"the keys of {issuer} are not available: {detail}")
        self.issuer = issuer
        self.retry_after = retry_after


def looks_like_jwt(token: str) -> bool:
    """Whether a bearer token is shaped as a JWS (and so is not one of Jetway's own ``jw_`` tokens)."""
    return token.startswith("eyJ") and token.count(".") == 2


class _AllowList(JWSRegistry):
    """joserfc's registry for one issuer: its algorithms only, each resolved once.

    ``get_alg`` is joserfc's public hook; resolving here also keeps its
    per-call SecurityWarning for ``EdDSA`` (RFC 9864 prefers ``Ed25519``)
    out of every verification. Header members joserfc does not know are
    ignored, as RFC 7515 says, unless named in ``crit`` (refused before).
    """

    max_header_length = 512
    max_payload_length = 8000
    max_signature_length = 1024

    def __init__(self, algorithms: Sequence[str]) -> None:
        super().__init__(algorithms=list(algorithms), strict_check_header=False)
        self._models: Dict[str, JWSAlgModel] = {name: JWSRegistry.algorithms[name] for name in algorithms}

    def get_alg(self, name: str) -> JWSAlgModel:
        model = self._models.get(name)
        if model is None:
            raise UnsupportedAlgorithmError(f"Algorithm of '{name}' is not allowed")
        return model


_SHAPE = _AllowList(())  # the size bounds, before an issuer is known


class _Trusted:
    """A configured issuer, its keys and its allow-list."""

    __slots__ = ("issuer", "keys", "registry")

    def __init__(self, issuer: Issuer, keys: IssuerKeys) -> None:
        self.issuer = issuer
        self.keys = keys
        self.registry = _AllowList(issuer.algorithms)


@dataclass
class _Read:
    """A token read and its claims checked; its signature not yet."""

    trusted: _Trusted
    signed: CompactSignature
    claims: Dict[str, Any]
    kid: str
    subject: str


class _Cached:
    __slots__ = ("key", "keys", "kid", "record")

    def __init__(self, record: TokenRecord, keys: IssuerKeys, kid: str, key: Key) -> None:
        self.record = record
        self.keys = keys
        self.kid = kid
        self.key = key


class JwtVerifier:
    """The configured issuers' tokens, verified (see the module's order) and cached until they expire.

    ``now``: wall-clock seconds, as ``exp`` is; ``clock``: what times the
    JWKS refreshes (the reactor unless given); ``fetch``: how a URL is got
    (``cache.credentials.jwks.HttpFetch`` unless given).
    """

    def __init__(
        self,
        issuers: Sequence[Issuer],
        reactor: Any,
        now: Any = time.time,
        clock: Any = None,
        fetch: Optional[Fetch] = None,
        max_cached: int = MAX_CACHED,
    ) -> None:
        self._now = now
        self._trusted: Dict[str, _Trusted] = {
            issuer.issuer: _Trusted(issuer, IssuerKeys(issuer, reactor, clock, fetch)) for issuer in issuers
        }
        self._cache: Dict[bytes, _Cached] = {}
        self._max_cached = max_cached
        self.signature_checks = 0

    def keys(self, issuer: str) -> IssuerKeys:
        """The keys of a configured issuer (by its exact ``issuer`` URL)."""
        return self._trusted[issuer].keys

    def start(self) -> defer.Deferred:
        """Fetch every issuer's keys; fires when each first fetch ended, well or not (never fails)."""
        return defer.gatherResults([trusted.keys.start() for trusted in self._trusted.values()])

    def stop(self) -> None:
        for trusted in self._trusted.values():
            trusted.keys.stop()

    def verify(self, token: str, digest: Optional[bytes] = None) -> Union[TokenRecord, defer.Deferred]:
        """The token's record; a Deferred of it only when its issuer's JWKS must be fetched first.

        Raises (or the Deferred fails with) ``JwtRefused`` or ``IssuerUnavailable``.
        ``digest``: the token's ``digest_of``, when the caller has it already
        (the hash is most of what a cached token costs).
        """
        if digest is None:
            digest = digest_of(token)
        record = self.cached(digest)
        return record if record is not None else self._verify_fresh(token, digest, remember=True)

    def cached(self, digest: bytes) -> Optional[TokenRecord]:
        """The record of a token verified before (by its digest), None if none is kept; ``JwtRefused`` if it
        expired or its key left the JWKS since. No token needed: a request whose digest is known pays no parse."""
        cached = self._cache.get(digest)
        return None if cached is None else self._still_valid(cached, digest)

    def _verify_fresh(self, token: str, digest: bytes, remember: bool) -> Union[TokenRecord, defer.Deferred]:
        read = self._read(token)
        keys = read.trusted.keys
        key = keys.key(read.kid)
        if key is not None:
            return self._accept(read, key, digest, remember)
        fetching = keys.refresh_for_unknown_kid()
        if fetching is None:
            raise self._unknown_kid(read)
        return fetching.addCallback(self._after_fetch, read, digest, remember)

    def _after_fetch(self, _: Any, read: _Read, digest: bytes, remember: bool) -> TokenRecord:
        key = read.trusted.keys.key(read.kid)
        if key is None:
            raise self._unknown_kid(read)
        return self._accept(read, key, digest, remember)

    def _unknown_kid(self, read: _Read) -> Exception:
        keys, issuer = read.trusted.keys, read.trusted.issuer
        if not keys.fetched:  # no key ever: nothing can be judged yet (a 503); else an unknown key is a 401
            detail = keys.last_error or "not fetched yet"
            return IssuerUnavailable(issuer.issuer, issuer.refresh_seconds, detail)
        return JwtRefused(f"no key {read.kid[:64]!r} in the JWKS of {issuer.issuer}")

    def _still_valid(self, cached: _Cached, digest: bytes) -> TokenRecord:
        if cached.record.expired(self._now()):
            self._cache.pop(digest, None)
            raise JwtRefused("expired")
        if cached.keys.key(cached.kid) is not cached.key:
            self._cache.pop(digest, None)
            raise JwtRefused(f"its key {cached.kid[:64]!r} left the JWKS of {cached.keys.issuer.issuer}")
        return cached.record

    def on_keys_installed(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever an issuer's JWKS is installed (``signed_by_current_key`` may have turned)."""
        for trusted in self._trusted.values():
            trusted.keys.on_install(listener)

    def signed_by_current_key(self, identity: Identity) -> bool:
        """Whether the key that verified ``identity``'s token is still its issuer's key of that kid (a ticket's
        snapshot, which keeps no key: whether the kid is still there)."""
        trusted = self._trusted.get(identity.issuer)
        key = trusted.keys.key(identity.kid) if trusted is not None else None
        return key is not None and (identity.key is None or key is identity.key)

    def _read(self, token: str) -> _Read:
        signed = _signed(token)
        header = signed.headers()
        claims = _claims(signed.payload)
        issuer_name = claims.get("iss")
        trusted = self._trusted.get(issuer_name) if isinstance(issuer_name, str) else None
        if trusted is None:
            raise JwtRefused(f"issuer {str(issuer_name)[:100]!r} is not configured")
        issuer = trusted.issuer
        alg = header.get("alg")
        if alg not in issuer.algorithms:
            raise JwtRefused(f"algorithm {str(alg)[:16]!r} is not allowed for {issuer.issuer}")
        kid = header.get("kid")
        if not isinstance(kid, str) or not 0 < len(kid) <= MAX_KID_LENGTH:
            raise JwtRefused("the token names no key (kid)")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in TOKEN_TYPES):
            raise JwtRefused(f"typ {str(typ)[:32]!r} is not a JWT access token's")
        _check_claims(claims, issuer, self._now())
        subject = claims.get(issuer.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise JwtRefused(f"no {issuer.subject_claim} (the subject) in the token")
        return _Read(trusted, signed, claims, kid, subject)

    def _accept(self, read: _Read, key: Key, digest: bytes, remember: bool) -> TokenRecord:
        self.signature_checks += 1
        try:
            valid = validate_compact(read.signed, key, registry=read.trusted.registry)
        except JoseError as error:  # the key does not fit the algorithm (type, curve, use)
            raise JwtRefused(f"key {read.kid[:64]!r} cannot check this token ({error.error})") from None
        if not valid:
            raise JwtRefused("bad signature")
        record = _record(read, digest, key)
        if remember:
            keep_bounded(self._cache, digest, _Cached(record, read.trusted.keys, read.kid, key), self._max_cached)
        return record


def _signed(token: str) -> CompactSignature:
    if not looks_like_jwt(token) or not all(_SEGMENT.match(part) for part in token.split(".")):
        raise JwtRefused("not a JWT (three base64url segments)")
    try:
        signed = extract_compact(token.encode("ascii"), registry=_SHAPE)
    except JoseError as error:
        raise JwtRefused(f"malformed ({error.error}: {error.description})") from None
    header = signed.headers()
    if not isinstance(header, dict):
        raise JwtRefused("malformed header")
    for name in REFUSED_HEADERS:
        if name in header:
            raise JwtRefused(f"header {name!r} is refused: keys and their addresses come from the issuer only")
    return signed


def _claims(payload: bytes) -> Dict[str, Any]:
    try:
        claims = loads(payload)
    except JsonError as error:
        raise JwtRefused(f"the claims are not valid JSON ({error})") from None
    if not isinstance(claims, dict):
        raise JwtRefused("the claims are not a JSON object")
    return claims


def _time(claims: Dict[str, Any], name: str) -> Optional[float]:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JwtRefused(f"{name} is not a number of seconds")
    return value


def _check_claims(claims: Dict[str, Any], issuer: Issuer, now: float) -> None:
    leeway = issuer.leeway_seconds
    expires = _time(claims, "exp")
    if expires is None:
        raise JwtRefused("no exp")
    if now >= expires + leeway:
        raise JwtRefused("expired")
    not_before = _time(claims, "nbf")
    if not_before is not None and not_before - leeway > now:
        raise JwtRefused("not valid yet (nbf)")
    issued = _time(claims, "iat")
    if issued is not None and issued - leeway > now:
        raise JwtRefused("issued in the future (iat)")
    audience = claims.get("aud")
    if not (audience == issuer.audience or (isinstance(audience, list) and issuer.audience in audience)):
        raise JwtRefused(f"not for audience {issuer.audience!r}")


def grants_of(claims: Dict[str, Any], issuer: Issuer) -> Tuple[str, ...]:
    """Jetway scopes from the issuer's scope claim (values of Jetway's pattern, prefix stripped) and fixed grants."""
    value = claims.get(issuer.scope_claim)
    if isinstance(value, str):
        values: List[Any] = value.split()
    elif isinstance(value, list):
        values = value
    else:
        values = []
    prefix = issuer.scope_prefix
    scopes: List[str] = []
    for scope in values:
        if not isinstance(scope, str) or not scope.startswith(prefix):
            continue
        scope = scope[len(prefix) :]
        if SCOPE_PATTERN.match(scope):
            scopes.append(scope)
    return tuple(dict.fromkeys([*scopes, *issuer.grants]))


def _record(read: _Read, digest: bytes, key: Key) -> TokenRecord:
    issuer, claims = read.trusted.issuer, read.claims
    expires = claims["exp"]
    issued = claims.get("iat")
    return TokenRecord(
        digest=digest,
        name=f"oidc:{issuer.label}:{read.subject}",
        scopes=grants_of(claims, issuer),
        rate="",
        expires=int(expires) + issuer.leeway_seconds,
        created=int(issued) if isinstance(issued, (int, float)) and not isinstance(issued, bool) else 0,
        identity=Identity(issuer.issuer, read.subject, read.kid, expires, MappingProxyType(claims), key),
    )


WARM_UP_ISSUER = "https://warm-up.invalid"


def warm_up(verifies: int, now: Any = time.time) -> float:
    """Verify two self-made tokens (RS256 and ES256) ``verifies`` times in all; the seconds it took.

    The same steps as any token's, without the claims cache (which would
    skip them), so PyPy's JIT has compiled them before the first user's
    token: the first verifications cost several times a warm one.
    """
    issuer = Issuer(WARM_UP_ISSUER, "warm-up", algorithms=("RS256", "ES256"))
    verifier = JwtVerifier([issuer], task.Clock(), now=now, fetch=_no_fetch)
    rsa = RSAKey.generate_key(2048, {"kid": "warm-rsa"})
    ec = ECKey.generate_key("P-256", {"kid": "warm-ec"})
    verifier.keys(WARM_UP_ISSUER).load({"keys": [rsa.as_dict(private=False), ec.as_dict(private=False)]})
    claims = {"iss": WARM_UP_ISSUER, "aud": "warm-up", "sub": "warm-up", "exp": int(now()) + 3600}
    tokens = [
        jwt.encode({"alg": "RS256", "kid": "warm-rsa"}, claims, rsa),
        jwt.encode({"alg": "ES256", "kid": "warm-ec"}, claims, ec),
    ]
    digests = [digest_of(token) for token in tokens]
    started = time.perf_counter()
    for index in range(verifies):
        verifier._verify_fresh(tokens[index % 2], digests[index % 2], remember=False)
    return time.perf_counter() - started


def _no_fetch(url: str, max_bytes: int, timeout: float) -> defer.Deferred:
    return defer.fail(JwksError(f"{url}: the warm-up fetches nothing"))
