"""A worker's in-memory cache of token records, invalidated from Redis.

Every worker subscribes to ``CHANGED_CHANNEL``; revoking or rotating a
token publishes its digest, and each worker drops it within a round trip.
Consistency rule: ``cache.fill_guard``'s, the rule of every cache filled
from Redis and invalidated by messages. While the subscription is not up
(starting, or its connection dropped) the cache is emptied and not used,
and a lookup whose reply comes back after an invalidation (a revocation's
message overtook it) is answered but not kept: so a revocation can never
be missed, nor undone by a reply that left Redis before it.
Unknown digests are not cached: a guessed token costs a lookup, never memory.

Whoever holds a credential open beyond one request (a change-feed stream)
hears every invalidation through ``on_change``: a digest when that token
was revoked or rotated, None when the subscription went down or came back
(every token must then be looked up again; ``cache.credentials.watch``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import txredisapi
from twisted.internet import defer

from cache.credentials.tokens import CHANGED_CHANNEL, TokenRecord, TokenStore
from cache.fill_guard import MAX_ENTRIES, FillGuard, keep_bounded
from cache.redis.address import RedisAddress
from cache.redis.topology import subscriber_endpoint


class _Subscriber(txredisapi.SubscriberProtocol):
    cache: TokenCache

    def connectionMade(self) -> Any:
        # txredisapi's connectionMade authenticates first; commands wait for it.
        self.whenConnected().addCallback(lambda _: self._subscribe())
        return super().connectionMade()

    def _subscribe(self) -> None:
        subscribing = self.subscribe([CHANGED_CHANNEL])
        # Failure to subscribe leaves the cache off; the reconnect tries again.
        subscribing.addCallbacks(lambda _: self.cache._subscribed(self), lambda _: self.transport.loseConnection())

    def messageReceived(self, pattern: Any, channel: Any, message: Any) -> None:
        self.cache.forget(message if isinstance(message, bytes) else str(message).encode())

    def connectionLost(self, reason: Any) -> None:
        self.cache._unsubscribed(self)
        super().connectionLost(reason)


class _SubscriberFactory(txredisapi.SubscriberFactory):
    protocol = _Subscriber
    maxDelay = 1.0
    initialDelay = 0.2

    def __init__(self, cache: TokenCache, address: RedisAddress) -> None:
        super().__init__(isLazy=True)
        self.cache = cache
        self.password = address.password
        self.username = address.username
        self.charset = None
        self.convertNumbers = False

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.cache = self.cache
        return protocol


class TokenCache:
    """Token records by digest, trusted only while subscribed (``cache.fill_guard``)."""

    def __init__(self, tokens: TokenStore, address: RedisAddress, reactor: Any, timeout: float) -> None:
        self.tokens = tokens
        self.reactor = reactor
        self._records: Dict[bytes, TokenRecord] = {}
        self._guard = FillGuard()
        self._listeners: List[Callable[[Optional[bytes]], None]] = []
        self._factory = _SubscriberFactory(self, address)
        self._factory.startConnecting(subscriber_endpoint(address, reactor, timeout))

    @property
    def subscribed(self) -> bool:
        return self._guard.source is not None

    def on_change(self, listener: Callable[[Optional[bytes]], None]) -> None:
        """``listener(digest)``: that token was revoked or rotated; ``listener(None)``: subscribed, or not any more."""
        self._listeners.append(listener)

    def cached(self, digest: bytes) -> Optional[TokenRecord]:
        """The token's record when the cache holds it and is kept true (subscribed); else None."""
        return self._records.get(digest) if self._guard.source is not None else None

    def lookup(self, digest: bytes) -> defer.Deferred:
        """The token's record (None if unknown): from the cache while subscribed, else from Redis."""
        record = self._records.get(digest)
        if record is not None and self._guard.source is not None:
            return defer.succeed(record)  # every authorized request: no generator, no Redis
        return self.tokens.lookup(digest).addCallback(self._remember, digest, self._guard.ticket())

    def _remember(self, record: Optional[TokenRecord], digest: bytes, ticket: int) -> Optional[TokenRecord]:
        if record is not None and self._guard.may_keep(ticket):
            keep_bounded(self._records, digest, record, MAX_ENTRIES)
        return record

    def forget(self, digest: bytes) -> None:
        """The token of ``digest`` was revoked or rotated (its message arrived)."""
        self._guard.invalidated()
        self._records.pop(digest, None)
        self._tell(digest)

    def close(self) -> defer.Deferred:
        return self._factory.disconnect()

    def _subscribed(self, protocol: _Subscriber) -> None:
        self._records.clear()
        self._guard.up(protocol)
        self._tell(None)

    def _unsubscribed(self, protocol: _Subscriber) -> None:
        self._guard.down(protocol)
        self._records.clear()
        self._tell(None)

    def _tell(self, digest: Optional[bytes]) -> None:
        for listener in self._listeners:
            listener(digest)
