"""Tickets: short-lived, read-only credentials for one collection's change feed.

A browser's ``EventSource`` cannot send ``Authorization``, and a bearer
token in a URL ends up in proxy logs and browser history. So a client with
a token asks for a ticket (``POST /v1/_changes/{coll}/tickets``) and puts
that in the URL instead. Redis keeps, under the SHA-256 of the ticket
(never the ticket itself), a hash with the digest of the token that asked
for it, the collection and the expiry; the key expires with the ticket:

    jw:{tokens}:k:<sha256 hex>   HASH  token (the token's digest), coll, expires (unix seconds)[, jwt]

A ticket is honoured only while its token is: every use looks the token up
by its digest, so revoking the token (its record is deleted) or rotating
it (its record moves to the new digest) kills its tickets at once, on
every worker (the token cache drops revoked records as ``cache.credentials.tokens``
publishes them). Tickets look like tokens (``jw_`` and 43 base64url
characters), so the access log redacts them as it redacts tokens.

A JWT (an OpenID Connect user's token) has no record in Redis to look up,
and nothing revokes it there: its ticket keeps, in ``jwt``, what its
admission verified (the grants, the issuer, the subject, the key and the
claims, as JSON), and expires at the earlier of its own lifetime and the
token's. A use admits the ticket as that snapshot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Optional, Tuple

from twisted.internet import defer

from cache.credentials.identity import Identity
from cache.credentials.tokens import TokenRecord, digest_of, new_token
from cache.json import codec
from cache.redis.link import Link
from cache.redis.script import Script

_TAG = b"jw:{tokens}"
DEFAULT_LIFETIME = 3600

# KEYS: the ticket. ARGV: token digest, collection, expires (unix s), lifetime (s), the JWT's snapshot ('': none).
_ISSUE = Script(
    b"""
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'coll', ARGV[2], 'expires', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'jwt', ARGV[5]) end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""
)


def ticket_key(digest: bytes) -> bytes:
    return _TAG + b":k:" + digest


@dataclass(frozen=True)
class TicketRecord:
    token_digest: bytes
    collection: bytes
    expires: int
    jwt: Optional[bytes] = None  # a JWT's snapshot (``snapshot_of``): admitted as it, not looked up

    def expired(self, now: float) -> bool:
        return now >= self.expires


class TicketStore:
    """Issue tickets and look them up; never stores a ticket, only its digest."""

    def __init__(self, link: Link, lifetime: int = DEFAULT_LIFETIME, clock: Callable[[], float] = time.time) -> None:
        self._link = link
        self.lifetime = lifetime
        self._clock = clock

    def issue(self, token_digest: bytes, collection: bytes, jwt: Optional[TokenRecord] = None) -> defer.Deferred:
        """A new ticket for ``collection``'s feed on behalf of a token (``jwt``: a JWT's verified record, kept
        as a snapshot and outlived by nobody: the ticket ends with the token); fires with ``(ticket, expires)``."""
        ticket = new_token()
        now = int(self._clock())
        expires = now + self.lifetime
        if jwt is not None:
            expires = min(expires, jwt.expires)
        issuing = self._link.run_script(
            _ISSUE,
            [ticket_key(digest_of(ticket))],
            [token_digest, collection, expires, max(1, expires - now), snapshot_of(jwt) if jwt is not None else b""],
        )
        return issuing.addCallback(lambda _: (ticket, expires))

    def lookup(self, ticket: str) -> defer.Deferred:
        """The ticket's record, or None if unknown or expired."""
        reading = self._link.execute(b"HMGET", ticket_key(digest_of(ticket)), b"token", b"coll", b"expires", b"jwt")
        return reading.addCallback(self._record)

    def _record(self, fields: Tuple[Any, ...]) -> Optional[TicketRecord]:
        token, collection, expires, jwt = fields
        if token is None or collection is None or expires is None:
            return None
        record = TicketRecord(token, collection, int(expires), jwt)
        return None if record.expired(self._clock()) else record


def snapshot_of(record: TokenRecord) -> bytes:
    """What a JWT's ticket keeps of its verified record (``record_of`` makes it again)."""
    identity = record.identity
    assert identity is not None
    return codec.dumps(
        {
            "name": record.name,
            "scopes": list(record.scopes),
            "expires": record.expires,
            "issuer": identity.issuer,
            "subject": identity.subject,
            "kid": identity.kid,
            "exp": identity.expires,
            "claims": dict(identity.claims),
        }
    )


def record_of(snapshot: bytes, digest: bytes) -> TokenRecord:
    """The token record a JWT's ticket stands for, from its snapshot (ValueError if it cannot be read)."""
    values = codec.loads(snapshot)
    identity = Identity(
        values["issuer"], values["subject"], values["kid"], values["exp"], MappingProxyType(values["claims"])
    )
    return TokenRecord(digest, values["name"], tuple(values["scopes"]), "", int(values["expires"]), 0, identity)
