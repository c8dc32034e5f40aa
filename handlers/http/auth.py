"""Who may do what: bearer tokens, scopes and rate limits (deny by default).

A request to ``/v1`` names a collection and is a read or a write. Its token
is one of Jetway's own, looked up by SHA-256 digest (in the worker's cache,
else in Redis), or a JWT of a configured OpenID Connect issuer, verified
(``cache.credentials.jwt_tokens``: its claims kept by the same digest until
it expires); it must not be expired, and must hold ``read:<coll>``,
``read:*``, ``write:...`` or ``admin``. A token with a rate spends one
request of it per call; for a document read that step rides in the same
pipeline as the read itself.
"""

from __future__ import annotations

import hmac
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from twisted.internet import defer

from cache.credentials.jwt_tokens import IssuerUnavailable, JwtRefused, JwtVerifier, looks_like_jwt
from cache.credentials.ratelimit import GCRA, RateDecision, decision, gcra_command
from cache.credentials.token_cache import TokenCache
from cache.credentials.tokens import TokenRecord, digest_of
from cache.credentials.watch import CredentialWatch, Hold
from cache.fill_guard import keep_bounded
from cache.redis.link import Link
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError

_BEARER = re.compile(r"Bearer +([A-Za-z0-9._~+/-]+=*) *\Z", re.IGNORECASE)
CHALLENGE = 'Bearer realm="jetway"'
RATE_SCRIPTS = (GCRA,)
# How many Authorization values of valid tokens keep their digest in memory (see Gate._remember_digest).
MAX_REMEMBERED_DIGESTS = 10_000
# A longer value is not remembered: the pattern lets a valid token carry any
# number of spaces, and 10,000 spellings of one token must not hold 64 KiB each.
MAX_REMEMBERED_LENGTH = 256
# Up to this length, a value spelled the one way (``Bearer <token>``, one space, nothing after) is remembered
# too: a provider's JWT is several hundred bytes to a few KB, and each token has one such spelling, so what is
# kept is bounded by the valid tokens seen, not by a client's padding.
MAX_REMEMBERED_TOKEN_LENGTH = 4096


def unauthorized(detail: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, {"WWW-Authenticate": CHALLENGE})


def issuer_unavailable(error: IssuerUnavailable) -> ApiError:
    """A JWT whose issuer's keys cannot be had now (never fetched, or its key unknown while the issuer is down)."""
    return ApiError(
        503,
        "issuer-unavailable",
        "the token's issuer cannot be reached to check its key; try again later",
        {"Retry-After": str(error.retry_after)},
    )


def _refused_jwt(failure: Any) -> Any:
    """A JWT verification that waited for its issuer's keys, refused: as the refusal at once would be."""
    failure.trap(JwtRefused, IssuerUnavailable)
    if failure.check(IssuerUnavailable):
        raise issuer_unavailable(failure.value)
    raise unauthorized("the token is not valid")


@dataclass(frozen=True)
class Grant:
    """An admitted request, with its rate decision or the command to get it.

    ``pending_rate`` is set (and ``rate`` is not yet) when the caller sends
    the rate step in one pipeline with its own read. ``ticket_expires``:
    when the request was admitted by a ticket, its expiry (unix seconds).
    """

    record: Optional[TokenRecord]
    rate: Optional[RateDecision] = None
    pending_rate: Optional[Tuple[Any, ...]] = None
    ticket_expires: int = 0

    def settle(self, reply: Any) -> RateDecision:
        """The decision from the reply to ``pending_rate``."""
        limit = self.record.rate_limit() if self.record else None
        return decision(reply, limit[0] if limit else 0)


class Gate:
    """Authorization for ``/v1`` handlers; ``enabled=False`` admits everyone."""

    def __init__(
        self,
        tokens: Optional[TokenCache],
        link: Link,
        enabled: bool,
        clock: Callable[[], float] = time.time,
        jwts: Optional[JwtVerifier] = None,
    ) -> None:
        self.tokens = tokens
        self.link = link
        self.enabled = enabled
        self.clock = clock
        self.jwts = jwts  # None: no OpenID Connect issuer is configured
        self._digests: Dict[str, bytes] = {}
        self._grants: Dict[bytes, Grant] = {}
        self._watch: Optional[CredentialWatch] = None

    def admit(self, authorization: Optional[str], collection: str, write: bool, defer_rate: bool) -> defer.Deferred:
        """Fires with the request's grant, or fails with an ``ApiError`` (401, 403, 429)."""
        try:
            outcome = self.grant_or_wait(authorization, collection, write, defer_rate)
        except ApiError as refused:
            return defer.fail(refused)
        return outcome if is_deferred(outcome) else defer.succeed(outcome)

    def grant_or_wait(
        self, authorization: Optional[str], collection: str, write: bool, defer_rate: bool
    ) -> Union[Grant, defer.Deferred]:
        """The grant, at once when nothing is needed from Redis, else a Deferred of it; raises a refusal.

        Nothing is needed when authorization is off, or when the token's
        record is in the worker's cache and it has no rate or its rate step
        rides with the request's own read (``defer_rate``): the usual
        document read is admitted without a Deferred. Plain callbacks
        otherwise, not a generator: this runs before every ``/v1`` request.
        """
        if not self.enabled or self.tokens is None:
            return Grant(None)
        digest = self._digest(authorization)
        record = self.tokens.cached(digest)
        if record is None and self.jwts is not None:
            record = self._verified_before(digest)
        if record is not None:  # a Grant, or a Deferred of the rate step
            return self._decide(record, authorization, digest, collection, write, defer_rate)
        found = self._record(authorization, digest)
        if is_deferred(found):
            return found.addCallback(self._decide, authorization, digest, collection, write, defer_rate)
        return self._decide(found, authorization, digest, collection, write, defer_rate)

    def _verified_before(self, digest: bytes) -> Optional[TokenRecord]:
        """A JWT's record kept since its verification; refused once it expired or its key left the JWKS."""
        try:
            return self.jwts.cached(digest)  # type: ignore[union-attr]
        except JwtRefused:
            raise unauthorized("the token is not valid") from None

    def _record(self, authorization: Optional[str], digest: bytes) -> Any:
        """The record of a token not held in memory: a JWT verified (at once when its issuer's key is known,
        else a Deferred), or a Deferred of Jetway's own token looked up in Redis (None: no such token)."""
        if self.jwts is not None:
            token = _BEARER.match(authorization or "")
            if token is not None and looks_like_jwt(token.group(1)):
                try:
                    verified = self.jwts.verify(token.group(1), digest)
                except JwtRefused:
                    raise unauthorized("the token is not valid") from None
                except IssuerUnavailable as error:
                    raise issuer_unavailable(error) from None
                return verified.addErrback(_refused_jwt) if is_deferred(verified) else verified
        return self.tokens.lookup(digest)  # type: ignore[union-attr]

    def hold(self, grant: Grant, end: Callable[[str], None]) -> Optional[Hold]:
        """Keep checking ``grant``'s credential while a stream uses it: ``end(reason)`` once it dies.

        None when there is nothing to check (authorization off). The
        reasons are ``cache.credentials.watch``'s.
        """
        if not self.enabled or self.tokens is None or grant.record is None:
            return None
        if self._watch is None:
            self._watch = CredentialWatch(self.tokens, self.clock, self.jwts)
        return self._watch.hold(grant.record, end, grant.ticket_expires)

    def admit_batch(self, authorization: Optional[str], cost: int) -> defer.Deferred:
        """A batch's grant: a valid token, and ``cost`` requests of its rate (one per operation).

        Scopes are each operation's own (``may``); a batch larger than the
        token's burst could never pass, and is refused as too large.
        """
        if not self.enabled or self.tokens is None:
            return defer.succeed(Grant(None))
        try:
            digest = self._digest(authorization)
            record = self._verified_before(digest) if self.jwts is not None else None
            found = self._record(authorization, digest) if record is None else record
        except ApiError as refused:
            return defer.fail(refused)
        found = found if is_deferred(found) else defer.succeed(found)
        return found.addCallback(self._decide, authorization, digest, None, True, False, cost)

    def _digest(self, authorization: Optional[str]) -> bytes:
        """The digest of the bearer token ``authorization`` carries; raises a 401 if it carries none."""
        digest = self._digests.get(authorization) if authorization else None
        if digest is not None:
            return digest
        match = _BEARER.match(authorization or "")
        if not match:
            raise unauthorized("send Authorization: Bearer <token>")
        return digest_of(match.group(1))

    def _decide(
        self,
        record: Optional[TokenRecord],
        authorization: str,
        digest: bytes,
        collection: Optional[str],
        write: bool,
        defer_rate: bool,
        cost: int = 1,
    ) -> Any:
        # Constant-time on the digest, and one answer for unknown, revoked
        # and expired alike: the response never says whether a token exists.
        # The record's own digest, remembered below for the token's next
        # requests, is the very object: no comparison at all.
        if (
            record is None
            or (record.digest is not digest and not hmac.compare_digest(record.digest, digest))
            or record.expired(self.clock())
        ):
            raise unauthorized("the token is not valid")
        self._remember_digest(authorization, record.digest)
        if collection is not None and not may(record.scopes, collection, write):
            raise ApiError(403, "forbidden", f"the token may not {'write' if write else 'read'} {collection}")
        limit = record.rate_limit() if record.rate else None  # no pattern to match without a rate
        if limit is None:
            return self._plain_grant(record)
        if cost > limit[0]:
            raise ApiError(
                413, "batch-too-large", f"{cost} operations are more than the token's burst of {limit[0]}; split them"
            )
        command = gcra_command(digest, *limit, cost)
        if defer_rate:
            return Grant(record, pending_rate=command)
        rating = self.link.pipeline_scripts([command], RATE_SCRIPTS)
        return rating.addCallback(lambda replies: Grant(record, rate=decision(replies[0], limit[0])))

    def _plain_grant(self, record: TokenRecord) -> Grant:
        """The grant of a token without a rate: one per record, made when the record is first seen.

        Every request of such a token is granted the same; a frozen
        dataclass made anew cost four ``object.__setattr__`` calls each time.
        """
        grant = self._grants.get(record.digest)
        if grant is None or grant.record is not record:
            grant = Grant(record)
            keep_bounded(self._grants, record.digest, grant, MAX_REMEMBERED_DIGESTS)
        return grant

    def _remember_digest(self, authorization: str, digest: bytes) -> None:
        """Keep a valid token's digest by the ``Authorization`` value that carried it.

        Its next request then skips the SHA-256 (on PyPy the hash goes
        through a cffi binding to OpenSSL, a visible share of a document
        read) and the pattern that finds the token in the header (each match
        allocates on PyPy). Only values whose token
        was valid are kept, so guessed ones cannot fill this; the digest of
        a token never changes, and whether the token is still valid is asked
        of the token cache on every request all the same.

        The kept digest is the record's own object, so that ``_decide``
        knows the token's next requests by identity, without a comparison. A
        token's first requests at once (a client with many connections) each
        look it up with a digest of their own, and the token cache keeps the
        last record read: so each request keeps its record's digest, and the
        later ones agree with the cache (tests/handlers/test_direct_after_a_burst.py).
        """
        if self._digests.get(authorization) is digest:
            return  # the usual request: kept already
        if len(authorization) <= MAX_REMEMBERED_LENGTH or _plainly_spelled(authorization):
            # A kept key is replaced in place: the same bytes, perhaps another object (the record's).
            keep_bounded(self._digests, authorization, digest, MAX_REMEMBERED_DIGESTS)


def _plainly_spelled(authorization: str) -> bool:
    """``Bearer <token>`` exactly, within ``MAX_REMEMBERED_TOKEN_LENGTH``: a long token's one spelling kept."""
    return (
        len(authorization) <= MAX_REMEMBERED_TOKEN_LENGTH
        and authorization.startswith("Bearer ")
        and " " not in authorization[7:]
    )


def may(scopes: Sequence[str], collection: str, write: bool) -> bool:
    # Joined with +: on PyPy an f-string costs several times as much, and this runs on every request.
    action = "write:" if write else "read:"
    return "admin" in scopes or action + "*" in scopes or action + collection in scopes
