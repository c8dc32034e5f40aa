"""Tickets: short-lived, read-only credentials for one collection's change feed.

A browser's ``EventSource`` cannot send ``Authorization``, and a bearer
token in a URL ends up in proxy logs and browser history. So a client with
a token asks for a ticket (``POST /v1/_changes/{coll}/tickets``) and puts
that in the URL instead. Redis keeps, under the SHA-256 of the ticket
(never the ticket itself), a hash with the digest of the token that asked
for it, the collection and the expiry; the key expires with the ticket:

    jw:{tokens}:k:<sha256 hex>   HASH  token (the token's digest), coll, expires (unix seconds)

A ticket is honoured only while its token is: every use looks the token up
by its digest, so revoking the token (its record is deleted) or rotating
it (its record moves to the new digest) kills its tickets at once, on
every worker (the token cache drops revoked records as ``cache.credentials.tokens``
publishes them). Tickets look like tokens (``jw_`` and 43 base64url
characters), so the access log redacts them as it redacts tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from twisted.internet import defer

from cache.credentials.tokens import digest_of, new_token
from cache.redis.link import Link
from cache.redis.script import Script

_TAG = b"jw:{tokens}"
DEFAULT_LIFETIME = 3600

# KEYS: the ticket. ARGV: token digest, collection, expires (unix s), lifetime (s).
_ISSUE = Script(
    b"""
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'coll', ARGV[2], 'expires', ARGV[3])
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

    def expired(self, now: float) -> bool:
        return now >= self.expires


class TicketStore:
    """Issue tickets and look them up; never stores a ticket, only its digest."""

    def __init__(self, link: Link, lifetime: int = DEFAULT_LIFETIME, clock: Callable[[], float] = time.time) -> None:
        self._link = link
        self.lifetime = lifetime
        self._clock = clock

    def issue(self, token_digest: bytes, collection: bytes) -> defer.Deferred:
        """A new ticket for ``collection``'s feed on behalf of a token; fires with ``(ticket, expires)``."""
        ticket = new_token()
        expires = int(self._clock()) + self.lifetime
        issuing = self._link.run_script(
            _ISSUE,
            [ticket_key(digest_of(ticket))],
            [token_digest, collection, expires, self.lifetime],
        )
        return issuing.addCallback(lambda _: (ticket, expires))

    def lookup(self, ticket: str) -> defer.Deferred:
        """The ticket's record, or None if unknown or expired."""
        reading = self._link.execute(b"HMGET", ticket_key(digest_of(ticket)), b"token", b"coll", b"expires")
        return reading.addCallback(self._record)

    def _record(self, fields: Tuple[Any, ...]) -> Optional[TicketRecord]:
        token, collection, expires = fields
        if token is None or collection is None or expires is None:
            return None
        record = TicketRecord(token, collection, int(expires))
        return None if record.expired(self._clock()) else record
