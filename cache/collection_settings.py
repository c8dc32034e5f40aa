"""A collection's settings in Redis: JSON Schema, default TTL, size limit, cache policy, write replicas, owner rule.

Layout (one hash tag, so every change is one script even on Redis Cluster;
settings are few and small):

    jw:{collections}:c:<coll>   HASH  s = the settings as JSON (the bytes
                                      the API answers with), e = ETag
    jw:{collections}:names      ZSET  every collection with settings (score 0)

A change (PUT or DELETE) publishes the collection's name on
``CHANGED_CHANNEL`` inside the same script, so each worker's cache
(``cache.settings_cache``) drops it within a round trip. A collection
without settings behaves exactly as before settings existed.

A stored schema that this version refuses (stored by an earlier one,
before ``cache.schemas.bounds``) leaves its collection's settings readable
and its reads working; each write to it is a ``StoredSchemaRefused`` that
says why and what an admin does about it. So are stored settings that fail
the other checks (a ``ttl`` or ``max_bytes`` out of range, a bad
``cache_control``, an unknown member, bytes that are not a JSON object,
written by hand or by an earlier version): ``StoredSettingsRefused`` on
each write (``parse_stored``), reads going on with the members that pass.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache.errors import StoreError
from cache.indexes.builds import apply_specs
from cache.indexes.declared import Index, IndexDeclarationError, declared_indexes
from cache.json import codec
from cache.ownership import OwnerRule, OwnerRuleError, owner_rule
from cache.redis.link import Link
from cache.redis.script import Script
from cache.schemas.schema import Compiled, CompiledSchema, DocumentInvalid, InvalidSchema, compile_schema

CHANGED_CHANNEL = b"jw:collections:changed"
_TAG = b"jw:{collections}"
NAMES_KEY = _TAG + b":names"
MAX_TTL = 31_536_000
MAX_REPLICAS = 16
# What a Cache-Control value may hold: visible ASCII and spaces, no line breaks.
_CACHE_CONTROL = re.compile(r"[\x20-\x7e]{1,256}\Z")
FIELDS = ("schema", "ttl", "max_bytes", "cache_control", "write_replicas", "indexes", "owner")


class SettingsError(ValueError):
    """Settings that cannot be stored; the message says which member and why."""


class OverCollectionLimit(StoreError):
    """A document larger than its collection's ``max_bytes`` (maps to 413)."""

    def __init__(self, size: int, collection: str, limit: int) -> None:
        super().__init__(f"the document is {size} bytes; collection {collection} takes at most {limit} (max_bytes)")


class StoredSettingsRefused(StoreError):
    """A write to a collection whose stored settings this version refuses (maps to 409): they must be replaced."""

    what = "settings"

    def __init__(self, collection: str, reason: str) -> None:
        super().__init__(
            f"collection {collection}'s stored {self.what} {'is' if self.what == 'schema' else 'are'} no longer"
            f" accepted: {reason}. No write to it is taken until an admin stores settings this version accepts"
            f" (PUT /v1/_collections/{collection}) or removes them (DELETE); reads are unaffected"
        )
        self.reason = reason


class StoredSchemaRefused(StoredSettingsRefused):
    """A write to a collection whose stored schema this version refuses (maps to 409): the setting must be replaced."""

    what = "schema"


def settings_key(collection: bytes) -> bytes:
    return _TAG + b":c:" + collection


def generation_key(collection: bytes) -> bytes:
    """A counter of the collection's settings changes: it orders the index specs its shards get."""
    return _TAG + b":g:" + collection


# KEYS: settings key, names, generation. ARGV: name, settings JSON, new etag, If-Match, If-None-Match, channel.
# Returns {0} when a condition failed, {1, generation} replaced, {2, generation} created. The generation
# (kept apart, so that it outlives a DELETE) orders the index specs the shards get (cache.indexes.builds).
_PUT = Script(
    b"""
local current = redis.call('HGET', KEYS[1], 'e')
local function matches(header)
  if header == '*' then return current ~= false end
  if not current then return false end
  for tag in string.gmatch(header, '%S+') do if tag == current then return true end end
  return false
end
if ARGV[4] ~= '' and not matches(ARGV[4]) then return {0} end
if ARGV[5] ~= '' and matches(ARGV[5]) then return {0} end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'e', ARGV[3])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('PUBLISH', ARGV[6], ARGV[1])
local generation = redis.call('INCR', KEYS[3])
if current then return {1, generation} end
return {2, generation}
"""
)

# KEYS: settings key, names, generation. ARGV: name, If-Match, channel.
# Returns {0} condition failed, {-1} missing, {1, generation} deleted.
_DELETE = Script(
    b"""
local current = redis.call('HGET', KEYS[1], 'e')
if ARGV[2] ~= '' and ARGV[2] ~= '*' then
  local found = false
  for tag in string.gmatch(ARGV[2], '%S+') do if tag == current then found = true end end
  if not found then return {0} end
end
if not current then return {-1} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return {1, redis.call('INCR', KEYS[3])}
"""
)


# KEYS: settings key, generation. Returns {settings JSON or false, generation or false}, read together.
_READ_WITH_GENERATION = Script(b"return {redis.call('HGET', KEYS[1], 's'), redis.call('GET', KEYS[2])}")


@dataclass(frozen=True)
class CollectionSettings:
    """One collection's settings, the schema compiled; ``NO_SETTINGS`` changes nothing."""

    name: str = ""
    body: bytes = b"{}"  # the settings as stored and answered
    etag: bytes = b""
    schema: Optional[CompiledSchema] = None
    ttl: Optional[int] = None
    max_bytes: Optional[int] = None
    cache_control: Optional[str] = None
    write_replicas: Optional[int] = None
    indexes: Tuple[Index, ...] = ()  # cache.indexes.declared, the owner rule's among them
    owner: Optional[OwnerRule] = None  # cache.ownership
    schema_refused: Optional[str] = None  # why this version refuses the stored schema: no write is taken
    settings_refused: Optional[str] = None  # why this version refuses the other stored settings: no write either

    def check(self, document: Any, size: int) -> None:
        """Raise ``OverCollectionLimit``, ``DocumentInvalid`` or ``StoredSettingsRefused`` for a document refused.

        Plain values in (the parsed document and its size in bytes), so a
        handler, the store's merge patch or a batch can call it alike.
        """
        if self.settings_refused is not None:
            raise StoredSettingsRefused(self.name, self.settings_refused)
        if self.schema_refused is not None:
            raise StoredSchemaRefused(self.name, self.schema_refused)
        if self.max_bytes is not None and size > self.max_bytes:
            raise OverCollectionLimit(size, self.name, self.max_bytes)
        if self.schema is not None and not self.schema.is_valid(document):
            raise DocumentInvalid(self.schema.violations(document))

    def ttl_or_default(self, ttl: Optional[int]) -> Optional[int]:
        """A write's ``?ttl``, or this collection's default when it gave none."""
        return self.ttl if ttl is None else ttl


NO_SETTINGS = CollectionSettings()


def stored_schema(body: bytes) -> Optional[Any]:
    """The schema of stored settings (None when they have none), uncompiled."""
    return checked_values(codec.loads(body)).get("schema")


def parse_settings(name: str, body: bytes, etag: bytes, compiled: Optional[Compiled] = None) -> CollectionSettings:
    """Settings from their JSON, with their schema ``compiled`` (or its refusal); without it, compiled here.

    Compiled here, a refused schema raises ``InvalidSchema`` (a PUT's 422);
    a refusal passed in makes settings whose writes are refused.
    """
    values = checked_values(codec.loads(body))
    schema = values.get("schema")
    if schema is None:
        compiled = None
    elif compiled is None:
        compiled = compile_schema(schema)
    return CollectionSettings(
        name=name,
        body=body,
        etag=etag,
        schema=compiled if isinstance(compiled, CompiledSchema) else None,
        schema_refused=str(compiled) if isinstance(compiled, InvalidSchema) else None,
        ttl=values.get("ttl"),
        max_bytes=values.get("max_bytes"),
        cache_control=values.get("cache_control"),
        write_replicas=values.get("write_replicas"),
        indexes=indexes_of(values),
        owner=owner_rule(values["owner"]) if "owner" in values else None,
    )


def parse_stored(name: str, body: bytes, etag: bytes, compiled: Optional[Compiled] = None) -> CollectionSettings:
    """Stored settings (``compiled``: their schema's outcome, if they have one); refused ones refuse writes.

    Settings that fail ``checked_values`` (stored by hand, or by a version
    with other bounds) are not an error here: their writes are each a
    ``StoredSettingsRefused`` saying why, and their reads keep the members
    that pass their own checks (a good ``cache_control`` still applies).
    """
    try:
        return parse_settings(name, body, etag, compiled)
    except (SettingsError, codec.JsonError) as error:
        reason = str(error)
    try:  # what a read uses; a write is refused whatever the rest says
        policy = checked_values({"cache_control": _loaded(body).get("cache_control")}).get("cache_control")
    except SettingsError:
        policy = None
    return CollectionSettings(name=name, body=body, etag=etag, cache_control=policy, settings_refused=reason)


def stored_schema_or_none(body: bytes) -> Optional[Any]:
    """``stored_schema``, or None for settings this version refuses anyway (``parse_stored`` says why)."""
    try:
        return stored_schema(body)
    except (SettingsError, codec.JsonError):
        return None


def stored_indexes(body: bytes) -> Tuple[Index, ...]:
    """The indexes stored settings declare: none if they declare none, or ones this version refuses
    (``parse_stored`` then refuses the collection's writes and says why). The schema is not compiled."""
    try:
        return indexes_of(_loaded(body))
    except (IndexDeclarationError, OwnerRuleError):
        return ()


def indexes_of(values: Dict[str, Any]) -> Tuple[Index, ...]:
    """The indexes settings declare, and the owner rule's (``IndexDeclarationError``, ``OwnerRuleError``)."""
    declared = declared_indexes(values["indexes"]) if values.get("indexes") is not None else ()
    if values.get("owner") is None:
        return declared
    rule = owner_rule(values["owner"]).index
    for index in declared:
        if index.name == rule.name:
            raise IndexDeclarationError(f"index name {rule.name} is the owner rule's own")
        for field in index.fields:
            owned = rule.fields[0]
            if field.name == owned.name and (field.pointer, field.type) != (owned.pointer, owned.type):
                raise IndexDeclarationError(f"field {field.name} is the owner rule's own (its pointer, a {owned.type})")
    return (*declared, rule)


def _loaded(body: bytes) -> Dict[str, Any]:
    try:
        values = codec.loads(body)
    except codec.JsonError:
        return {}
    return values if isinstance(values, dict) else {}


def checked_values(values: Any) -> Dict[str, Any]:
    """The members of a settings object, each checked; ``SettingsError`` (or ``InvalidSchema``) says why not."""
    if not isinstance(values, dict):
        raise SettingsError("the settings must be a JSON object")
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise SettingsError(f"unknown member {unknown[0]!r}; the members are {', '.join(FIELDS)}")
    for name, low, high in (("ttl", 1, MAX_TTL), ("max_bytes", 2, None), ("write_replicas", 0, MAX_REPLICAS)):
        value = values.get(name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high)
        ):
            bound = f"from {low} to {high}" if high else f"of at least {low}"
            raise SettingsError(f"{name} must be a whole number {bound}, not {codec.dumps(value)[:40].decode()}")
    policy = values.get("cache_control")
    if policy is not None and not (isinstance(policy, str) and _CACHE_CONTROL.match(policy)):
        raise SettingsError("cache_control must be a Cache-Control header value (printable ASCII, 1-256 characters)")
    if "schema" in values and values["schema"] is None:
        raise SettingsError("schema must be a JSON Schema object; leave it out for none")
    try:
        indexes_of(values)
    except IndexDeclarationError as error:
        raise SettingsError(f"indexes: {error}") from None
    except OwnerRuleError as error:
        raise SettingsError(str(error)) from None
    return {name: value for name, value in values.items() if value is not None}


class CollectionSettingsStore:
    """Read, write, list and delete collection settings in Redis."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._counter = 0
        self._prefix = os.urandom(6).hex()

    def _new_etag(self) -> bytes:
        self._counter += 1
        return b'"c%s-%x"' % (self._prefix.encode(), self._counter)

    def read(self, name: str) -> defer.Deferred:
        """``(body, etag)`` or None."""
        reading = self._link.execute(b"HMGET", settings_key(name.encode()), b"s", b"e")
        return reading.addCallback(lambda fields: None if fields[0] is None else (fields[0], fields[1]))

    @defer.inlineCallbacks
    def put(
        self,
        name: str,
        values: Dict[str, Any],
        if_match: bytes = b"",
        if_none_match: bytes = b"",
        compiled: Optional[CompiledSchema] = None,
    ) -> Any:
        """Store checked settings; fires with ``(CollectionSettings, created)``; ``None`` when a condition failed.

        Then each index shard of the collection gets the spec of its
        declared indexes (``cache.indexes.builds.apply_specs``): the writes
        keep them from then on, and the indexes new to it are to be built.

        ``compiled`` is ``values``' schema compiled already (off the reactor
        thread: ``cache.schemas.versions``); without it, it is compiled here.
        """
        body = codec.dumps(checked_values(values))
        settings = parse_settings(name, body, self._new_etag(), compiled)
        result = yield self._link.run_script(
            _PUT,
            [settings_key(name.encode()), NAMES_KEY, generation_key(name.encode())],
            [name, body, settings.etag, if_match, if_none_match, CHANGED_CHANNEL],
        )
        if result[0] == 0:
            return None
        yield self._apply_specs(name, result[1], settings.indexes)
        return settings, result[0] == 2

    @defer.inlineCallbacks
    def delete(self, name: str, if_match: bytes = b"") -> Any:
        """Fires with 1 (deleted), 0 (a condition failed) or -1 (no settings); a deletion drops the indexes."""
        result = yield self._link.run_script(
            _DELETE,
            [settings_key(name.encode()), NAMES_KEY, generation_key(name.encode())],
            [name, if_match, CHANGED_CHANNEL],
        )
        if result[0] == 1:
            yield self._apply_specs(name, result[1], ())
        return result[0]

    @defer.inlineCallbacks
    def _apply_specs(self, name: str, generation: int, indexes: Sequence[Index]) -> Any:
        """The shards get the change's indexes; then the change is published again, for the workers to start
        the builds of new indexes and the sweeps of dropped ones (``cache.indexes.upkeep``), which the first
        message, sent before the shards had the specs, came too early for."""
        yield apply_specs(self._link, name.encode(), generation, indexes)
        yield self._link.execute(b"PUBLISH", CHANGED_CHANNEL, name.encode())

    @defer.inlineCallbacks
    def reapply_indexes(self, name: str) -> Any:
        """Give the shards the indexes the stored settings declare, again; fires with those indexes.

        For a settings change whose specs did not all arrive (the worker
        that stored it died in between, or Redis went away): a query that
        finds an index missing from a shard calls this. The settings and
        their generation are read together, so a later change is never
        undone by it.
        """
        body, generation = yield self._link.run_script(
            _READ_WITH_GENERATION, [settings_key(name.encode()), generation_key(name.encode())], []
        )
        if body is None or generation is None:
            return ()
        indexes = stored_indexes(body)
        yield apply_specs(self._link, name.encode(), int(generation), indexes)
        return indexes

    @defer.inlineCallbacks
    def read_all(self) -> Any:
        """Every collection's ``(name, body, etag)``, by name."""
        names: List[bytes] = yield self._link.execute(b"ZRANGE", NAMES_KEY, 0, -1)
        if not names:
            return []
        rows = yield self._link.pipeline([(b"HMGET", settings_key(name), b"s", b"e") for name in names])
        found: List[Tuple[str, bytes, bytes]] = []
        for name, (body, etag) in zip(names, rows):
            if body is not None:
                found.append((name.decode(), body, etag))
        return found


__all__ = [
    "CHANGED_CHANNEL",
    "NO_SETTINGS",
    "CollectionSettings",
    "CollectionSettingsStore",
    "Compiled",
    "DocumentInvalid",
    "InvalidSchema",
    "OverCollectionLimit",
    "SettingsError",
    "StoredSchemaRefused",
    "StoredSettingsRefused",
    "checked_values",
    "parse_settings",
    "parse_stored",
    "stored_indexes",
    "stored_schema",
    "stored_schema_or_none",
]
