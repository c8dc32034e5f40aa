"""Credentials held beyond one request (change-feed streams, long polls), ended as soon as they are no longer valid.

A credential is checked for as long as it is used (DESIGN.md, "Trust
rules"): a stream admitted by a token, or by a ticket standing for one,
holds a ``Hold`` on that token's digest for as long as it is open, and the
hold calls its ``end(reason)`` once, the moment the credential dies:

- ``token-revoked``: the token cache heard the token's revocation or
  rotation (``TokenCache.on_change``; the message reaches every worker of
  every instance within a round trip). The holds are found by digest, so
  a worker with thousands of streams makes no Redis call for them.
- ``token-expired`` / ``ticket-expired``: a timer per hold, at the earlier
  of the token's expiry and the ticket's.
- A revocation nobody heard: when the token cache's subscription goes down
  or comes back (``cache.fill_guard``'s rule 1), every held token is looked
  up again (one lookup per distinct token, not per stream), at once and
  every ``RECHECK_SECONDS`` for as long as the subscription is down. A
  token found gone ends its holds. A lookup that fails (Redis does not
  answer) ends nothing: the stream has nothing new to send either, and
  the token is looked up again next time.
- A JWT (``record.identity``, an OpenID Connect token) is nobody's to
  revoke in Redis: its hold ends at its expiry (``exp`` plus the issuer's
  leeway) and is never looked up; and, as ``token-revoked``, when a JWKS
  installed (a refresh, every ``refresh_seconds`` or for an unknown kid)
  no longer holds the key that verified it: the issuer withdrew the key,
  so its tokens stop, streams already open included, within one refresh.
- A hold made while the token cache does not hold the token's record (the
  request's lookup was overtaken by a revocation and not kept, or the
  subscription is down) is looked up once after it is made: a revocation
  before that is seen by the lookup, one after it by its message.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Optional, Set

from cache.credentials.identity import Identity
from cache.credentials.token_cache import TokenCache
from cache.credentials.tokens import TokenRecord

TOKEN_REVOKED = "token-revoked"
TOKEN_EXPIRED = "token-expired"
TICKET_EXPIRED = "ticket-expired"
# While the token cache is not subscribed: how often held tokens are looked up again.
RECHECK_SECONDS = 0.5


class Hold:
    """One stream's use of a credential; ``release`` when the stream ends for any other reason."""

    __slots__ = ("digest", "end", "ended", "identity", "timer", "watch")

    def __init__(
        self, watch: CredentialWatch, digest: bytes, end: Callable[[str], None], identity: Optional[Identity] = None
    ) -> None:
        self.watch = watch
        self.digest = digest
        self.end = end
        self.identity = identity  # a JWT's: checked against its issuer's keys at each JWKS installed
        self.ended: Optional[str] = None
        self.timer: Optional[Any] = None

    def release(self) -> None:
        self.watch.release(self)


class CredentialWatch:
    """This worker's holds, by token digest; ``clock``: wall seconds, as token and ticket expiries are;
    ``jwts``: the ``JwtVerifier`` whose JWKS installs end the holds of JWTs whose key left (None: no issuer)."""

    def __init__(self, tokens: TokenCache, clock: Callable[[], float] = time.time, jwts: Any = None) -> None:
        self._tokens = tokens
        self._reactor = tokens.reactor
        self._clock = clock
        self._holds: Dict[bytes, Set[Hold]] = {}
        self._jwt_holds: Set[Hold] = set()
        self._jwts = jwts
        self._recheck: Optional[Any] = None
        tokens.on_change(self._changed)
        if jwts is not None:
            jwts.on_keys_installed(self._keys_installed)

    def __len__(self) -> int:
        return sum(len(holds) for holds in self._holds.values())

    def hold(self, record: TokenRecord, end: Callable[[str], None], ticket_expires: int = 0) -> Hold:
        """Watch ``record``'s token (and a ticket's expiry, unix seconds; 0: none) until released or ended."""
        hold = Hold(self, record.digest, end, record.identity)
        until, reason = record.expires, TOKEN_EXPIRED
        if ticket_expires and (not until or ticket_expires < until):
            until, reason = ticket_expires, TICKET_EXPIRED
        if until:
            hold.timer = self._reactor.callLater(max(0.0, until - self._clock()), self._end, hold, reason)
        if record.identity is not None:
            self._jwt_holds.add(hold)  # a JWT: its expiry or its key's removal ends it, never Redis
            return hold
        self._holds.setdefault(record.digest, set()).add(hold)
        if self._tokens.cached(record.digest) is None:
            self._look_up([record.digest])
            self._recheck_while_down()  # this watch may be made (lazily) after the subscription went down
        return hold

    def release(self, hold: Hold) -> None:
        self._jwt_holds.discard(hold)
        holds = self._holds.get(hold.digest)
        if holds is not None:
            holds.discard(hold)
            if not holds:
                del self._holds[hold.digest]
        if hold.timer is not None and hold.timer.active():
            hold.timer.cancel()
        hold.timer = None

    def _end(self, hold: Hold, reason: str) -> None:
        if hold.ended is not None:
            return
        hold.ended = reason
        self.release(hold)
        hold.end(reason)

    def _end_all(self, digest: bytes, reason: str) -> None:
        for hold in list(self._holds.get(digest, ())):
            self._end(hold, reason)

    def _keys_installed(self) -> None:
        for hold in list(self._jwt_holds):
            if hold.identity is not None and not self._jwts.signed_by_current_key(hold.identity):
                self._end(hold, TOKEN_REVOKED)

    def _changed(self, digest: Optional[bytes]) -> None:
        if digest is not None:
            self._end_all(digest, TOKEN_REVOKED)
            return
        # Subscribed again, or not any more: a revocation may have gone unheard.
        self._look_up(list(self._holds))
        self._recheck_while_down()

    def _recheck_while_down(self) -> None:
        if not self._tokens.subscribed and self._recheck is None:
            self._recheck = self._reactor.callLater(RECHECK_SECONDS, self._rechecking)

    def _rechecking(self) -> None:
        self._recheck = None
        if self._tokens.subscribed:
            return  # subscribed again: that looked every held token up once, and messages do the rest
        self._look_up(list(self._holds))
        self._recheck = self._reactor.callLater(RECHECK_SECONDS, self._rechecking)

    def _look_up(self, digests: Iterable[bytes]) -> None:
        for digest in digests:
            self._tokens.lookup(digest).addCallbacks(self._found, lambda _: None, callbackArgs=(digest,))

    def _found(self, record: Optional[TokenRecord], digest: bytes) -> None:
        if record is None:  # TokenStore.lookup builds the record with the digest asked
            self._end_all(digest, TOKEN_REVOKED)
        elif record.expired(self._clock()):
            self._end_all(digest, TOKEN_EXPIRED)
