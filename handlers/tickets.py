"""``POST /v1/_changes/{coll}/tickets``, and admitting a feed request by its ``?ticket=``.

A ticket (``cache.credentials.tickets``) stands for one token's read of one
collection's change feed, for ``JETWAY_FEED_TICKET_TTL`` seconds (an hour
by default, so that an ``EventSource``'s own reconnects keep working). It
admits ``GET /v1/_changes/{coll}`` and nothing else: every other route reads
only ``Authorization``. On each use the token behind it must still be valid
(not revoked, rotated or expired) and still hold read scope on the
collection, and its rate limit applies. A ticket is never echoed: not in a
problem body, and the access log redacts it like a token.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from twisted.internet import defer

from cache.credentials.ratelimit import decision, gcra_command
from cache.credentials.tickets import TicketRecord, TicketStore, record_of
from cache.credentials.tokens import TokenRecord
from cache.json import codec
from handlers.base import ResourceHandler
from handlers.http import validation
from handlers.http.auth import RATE_SCRIPTS, Gate, Grant, may, unauthorized
from handlers.http.cache_policy import ERROR_POLICY
from handlers.http.errors import ApiError

_TICKET = re.compile(r"jw_[A-Za-z0-9_-]{43}\Z")


def feed_off() -> ApiError:
    return ApiError(404, "feed-off", "the change feed is turned off on this server (JETWAY_FEED=off)")


class TicketGate:
    """Admits a change-feed request by its ticket, as its token's read of that collection."""

    def __init__(self, tickets: TicketStore, gate: Gate, clock: Callable[[], float] = time.time) -> None:
        self.tickets = tickets
        self.gate = gate
        self.clock = clock

    def admit(self, ticket: str, collection: str) -> defer.Deferred:
        """Fires with a ``Grant``, or fails with 401 (no valid ticket), 403 or 429."""
        if not self.gate.enabled or self.gate.tokens is None:
            return defer.succeed(Grant(None))
        if not _TICKET.match(ticket):
            return defer.fail(unauthorized("the ticket is not valid"))
        return self.tickets.lookup(ticket).addCallback(self._ticket_found, collection)

    def _ticket_found(self, ticket: Optional[TicketRecord], collection: str) -> defer.Deferred:
        if ticket is None:
            raise unauthorized("the ticket is not valid")
        if ticket.collection != collection.encode():
            raise ApiError(403, "forbidden", f"the ticket is for another collection's feed, not {collection}'s")
        if ticket.jwt is not None:  # a JWT's: admitted as the snapshot its issue verified (nothing to look up)
            try:
                record = record_of(ticket.jwt, ticket.token_digest)
            except (ValueError, KeyError, TypeError):
                raise unauthorized("the ticket is not valid") from None
            return self._token_found(record, ticket, collection)
        assert self.gate.tokens is not None
        return self.gate.tokens.lookup(ticket.token_digest).addCallback(self._token_found, ticket, collection)

    def _token_found(self, record: Optional[TokenRecord], ticket: TicketRecord, collection: str) -> Any:
        # A revoked or rotated token has no record under this digest any more.
        if record is None or record.digest != ticket.token_digest or record.expired(self.clock()):
            raise unauthorized("the ticket is not valid")
        if not may(record.scopes, collection, write=False):
            raise ApiError(403, "forbidden", f"the ticket's token may not read {collection}")
        limit = record.rate_limit()
        if limit is None:
            return Grant(record, ticket_expires=ticket.expires)
        rating = self.gate.link.pipeline_scripts([gcra_command(record.digest, *limit)], RATE_SCRIPTS)
        return rating.addCallback(
            lambda replies: Grant(record, rate=decision(replies[0], limit[0]), ticket_expires=ticket.expires)
        )


class TicketHandler(ResourceHandler):
    """Issues a ticket for the collection's feed to a bearer token with read scope on it."""

    ROUTE = "changes_tickets"

    def initialize(self, tickets: Optional[TicketStore], **documents: Any) -> None:
        super().initialize(**documents)
        self.tickets = tickets

    def post(self, collection: str) -> defer.Deferred:
        name = validation.collection_name(collection)
        if self.tickets is None:
            raise feed_off()
        record = self.grant.record
        digest = record.digest if record is not None else b""
        jwt = record if record is not None and record.identity is not None else None
        return self.tickets.issue(digest, name, jwt).addCallback(self._issued)

    def _issued(self, issued: Any) -> None:
        ticket, expires = issued
        moment = datetime.fromtimestamp(expires, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        # A credential: no cache may keep it.
        self.set_header("Cache-Control", ERROR_POLICY)
        self.send_bytes(201, codec.dumps({"ticket": ticket, "expires_at": moment}))
