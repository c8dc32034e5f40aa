"""A worker's cache of collection settings, invalidated from Redis.

Consistency rule: ``cache.fill_guard``'s, the rule of every cache filled
from Redis and invalidated by messages. A cached entry (settings, or "this
collection has none") is used only while this worker is subscribed to
``cache.collection_settings.CHANGED_CHANNEL``; a change publishes the
collection's name in the script that makes it, and the entry is dropped
when the message arrives (within a round trip, on every worker of every
instance). While the subscription is down (starting, or its connection
lost) the cache is emptied and every lookup reads Redis. A change that
bypasses the scripts (FLUSHALL, a key edited by hand) publishes nothing:
publish ``*`` after it (``FORGET_ALL``). A read that was
under way when an invalidation came is not cached (its answer may predate
the change). A schema is compiled once per version (its ETag), however
often it is read again, off the reactor thread (``cache.schemas.versions``);
a stored schema this version refuses is refused once per version too, and
its collection's writes answer why (``StoredSchemaRefused``); so do stored
settings that fail the other checks (``StoredSettingsRefused``), kept as
any entry is, until their collection's next change.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from twisted.internet import defer

from cache.collection_settings import (
    CHANGED_CHANNEL,
    NO_SETTINGS,
    CollectionSettings,
    CollectionSettingsStore,
    checked_values,
    parse_stored,
    stored_schema_or_none,
)
from cache.credentials.token_cache import _Subscriber as _TokenSubscriber
from cache.credentials.token_cache import _SubscriberFactory as _TokenSubscriberFactory
from cache.fill_guard import MAX_ENTRIES, FillGuard, keep_bounded
from cache.redis.address import RedisAddress
from cache.redis.topology import subscriber_endpoint
from cache.schemas.versions import SchemaVersions

_NONE: Tuple[()] = ()  # cached "this collection has no settings"
# Published by hand (``PUBLISH jw:collections:changed '*'``) after a FLUSHALL or
# an edit of the keys that bypassed the scripts: every worker drops every entry.
FORGET_ALL = b"*"


class _Subscriber(_TokenSubscriber):
    def _subscribe(self) -> None:
        subscribing = self.subscribe([CHANGED_CHANNEL])
        subscribing.addCallbacks(lambda _: self.cache._subscribed(self), lambda _: self.transport.loseConnection())


class _SubscriberFactory(_TokenSubscriberFactory):
    protocol = _Subscriber


class SettingsCache:
    """Collection settings by name, trusted only while subscribed; ``on_change`` hears every invalidation."""

    def __init__(
        self,
        store: CollectionSettingsStore,
        address: Optional[RedisAddress],
        reactor: Any,
        timeout: float,
        schemas: Optional[SchemaVersions] = None,
    ) -> None:
        self.store = store
        self._entries: Dict[str, Any] = {}
        self.schemas = schemas or SchemaVersions(reactor)
        self._guard = FillGuard()
        self._listeners: List[Callable[[Optional[bytes]], None]] = []
        self._factory: Optional[_SubscriberFactory] = None
        if address is not None:
            self._factory = _SubscriberFactory(self, address)  # type: ignore[arg-type]
            self._factory.startConnecting(subscriber_endpoint(address, reactor, timeout))

    @property
    def subscribed(self) -> bool:
        return self._guard.source is not None

    @property
    def generation(self) -> int:
        """Moved on by every invalidation: what was read under another one is not kept."""
        return self._guard.generation

    def on_change(self, listener: Callable[[Optional[bytes]], None]) -> None:
        """``listener`` hears each invalidation: the collection's name, ``FORGET_ALL``, or None when the
        subscription came up or went down (anything may have changed meanwhile)."""
        self._listeners.append(listener)

    def get(self, name: str) -> defer.Deferred:
        """The collection's ``CollectionSettings``, or None: from memory while subscribed, else from Redis."""
        entry = self._entries.get(name)
        if entry is not None and self._guard.source is not None:
            return defer.succeed(entry or None)  # every write to a known collection: no Redis
        return self.fresh(name)

    def fresh(self, name: str) -> defer.Deferred:
        """The collection's settings (or None) read from Redis now, and remembered.

        For a request that another worker's change may have outrun: a query
        naming an index that this worker's settings do not list yet (the
        change's message is on its way) reads them again before it refuses.
        """
        ticket = self._guard.ticket()
        reading = self.store.read(name).addCallback(self._parsed, name)
        return reading.addCallback(self._remember, name, ticket)

    @defer.inlineCallbacks
    def put(self, name: str, values: Any, if_match: bytes = b"", if_none_match: bytes = b"") -> Any:
        """``CollectionSettingsStore.put``, the schema compiled off the reactor first (``InvalidSchema`` if refused).

        The version stored is remembered compiled: this worker's next write
        to the collection does not compile it again.
        """
        checked = checked_values(values)
        compiled = (yield self.schemas.compile(checked["schema"])) if "schema" in checked else None
        stored = yield self.store.put(name, checked, if_match, if_none_match, compiled)
        if stored is not None and compiled is not None:
            self.schemas.remember(name, stored[0].etag, compiled)
        return stored

    def peek(self, name: str) -> Optional[CollectionSettings]:
        """The collection's settings if this worker knows them now (``NO_SETTINGS`` for none); else None.

        No Deferred: for reads, which want the cache policy at the cost of a
        dictionary lookup and read Redis only when the settings are not known.
        """
        entry = self._entries.get(name)
        if entry is None or self._guard.source is None:
            return None
        return entry or NO_SETTINGS

    def resolve(self, name: str) -> Any:
        """The collection's settings (``NO_SETTINGS`` for none): now when known, else a Deferred of them.

        The one way a request learns its collection's settings: a write's
        rules and a read's cache policy alike.
        """
        known = self.peek(name)
        if known is not None:
            return known
        return self.get(name).addCallback(lambda found: found or NO_SETTINGS)

    def _parsed(self, row: Optional[Tuple[bytes, bytes]], name: str) -> Any:
        """Stored settings parsed, their schema compiled (or its refusal) for this version: maybe a Deferred."""
        if row is None:
            return None
        body, etag = row
        schema = stored_schema_or_none(body)
        if schema is None:
            return parse_stored(name, body, etag)
        return self.schemas.outcome(name, etag, schema).addCallback(
            lambda compiled: parse_stored(name, body, etag, compiled)
        )

    def _remember(self, settings: Optional[CollectionSettings], name: str, ticket: int) -> Optional[CollectionSettings]:
        if self._guard.may_keep(ticket):
            keep_bounded(self._entries, name, settings or _NONE, MAX_ENTRIES)
        return settings

    def forget(self, name: bytes) -> None:
        """Drop a collection's entry; ``*`` drops them all (what to publish after changing keys by hand)."""
        if name == FORGET_ALL:
            self._entries.clear()
        else:
            self._entries.pop(name.decode("utf-8", "replace"), None)
        self._changed(name)

    def close(self) -> defer.Deferred:
        return self._factory.disconnect() if self._factory is not None else defer.succeed(None)

    def _changed(self, name: Optional[bytes] = None) -> None:
        self._guard.invalidated()
        self._tell(name)

    def _tell(self, name: Optional[bytes] = None) -> None:
        for listener in self._listeners:
            listener(name)

    def _subscribed(self, protocol: _Subscriber) -> None:
        self._entries.clear()
        self._guard.up(protocol)
        self._tell()

    def _unsubscribed(self, protocol: _Subscriber) -> None:
        self._guard.down(protocol)
        self._entries.clear()
        self._tell()


def settings_of(collections: Optional[SettingsCache], name: str) -> Any:
    """``collections.resolve(name)``, or ``NO_SETTINGS`` for a worker without the settings cache.

    The one way a request learns its collection's settings: the pipelines
    (``handlers.document_answers``) and the handlers (``handlers.base``) both ask here.
    """
    return NO_SETTINGS if collections is None else collections.resolve(name)
