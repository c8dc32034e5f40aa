"""The Redis key layout, designed for one Redis and for Redis Cluster alike.

A document and the index entry that lists it must change together, in one
Lua script, so they share a hash slot; yet the documents of one big
collection must spread over the nodes of a cluster. So each collection is cut
into ``INDEX_SHARDS`` shards by a CRC32 of the document id, and the shard
(not the collection) is the hash tag:

    jw:{<coll>:<shard>}:d:<id>   HASH   b = body bytes, e = ETag, m = Last-Modified
    jw:{<coll>:<shard>}:i        ZSET   the ids of that shard, all score 0
    jw:{<coll>:<shard>}:f        STREAM the shard's change feed (``cache.feed.streams``)
    ji:{<coll>:<shard>}:xs, :x:* the shard's declared indexes (``cache.indexes.scripts``)

``<shard>`` is two hex digits. Collection names and ids cannot contain
``{`` or ``}`` (see the route patterns), so no other hash tag can appear.
Listing a collection reads the ``INDEX_SHARDS`` indexes by lexical range
and merges them; a read of one document is one ``HMGET`` of one key.
Changing ``INDEX_SHARDS`` changes where documents live: it is part of the
stored format, not a tuning knob.

Why this fits Redis Cluster (``cache.redis.cluster``):

- What must change atomically shares a slot. A write is one script over a
  document and its index shard, both under ``{<coll>:<shard>}``; a token
  and its name entries are all under ``{tokens}`` (``cache.credentials.tokens``); a rate
  limit is one key, ``jw:rl:{<digest>}`` (``cache.credentials.ratelimit``). No script
  and no command ever names keys of two slots, so none can fail with
  ``CROSSSLOT``, and a command is routed by its first key alone.
- Data spreads. The hash tag of a document is its shard, not its collection,
  so one collection covers ``INDEX_SHARDS`` slots, which land on different
  nodes, and many collections cover the whole cluster. A hash tag per
  collection would pin each collection, however big, to one node.
- Reads that span slots are not atomic, and need not be: a list page is
  ``INDEX_SHARDS`` range reads merged in id order and a multi-get is one
  ``HGET`` per id; the cluster link sends each node its share at once, so
  either is still one round trip. A page already tolerates a document that
  changes or expires between the index read and the body read.
- Slot migrations (resharding) stay invisible: a script's keys move together
  (same slot); while a slot is half-moved, ``ASK``/``TRYAGAIN`` are followed
  by the link and the client sees only a slower request.
- The token cache's invalidation channel is plain pub/sub, which a cluster
  forwards to every node; a subscriber may use any node.
"""

from __future__ import annotations

import zlib
from typing import Optional, Tuple

INDEX_SHARDS = 16
PREFIX = b"jw:"


def shard_of(doc_id: bytes) -> int:
    """The index shard a document id belongs to."""
    return zlib.crc32(doc_id) % INDEX_SHARDS


def _tag(collection: bytes, shard: int) -> bytes:
    return PREFIX + b"{" + collection + b":%02x}" % shard


def document_key(collection: bytes, doc_id: bytes) -> bytes:
    """The hash that holds one document's body, ETag and modification time."""
    return _tag(collection, shard_of(doc_id)) + b":d:" + doc_id


def document_and_index_keys(collection: bytes, doc_id: bytes, shard: Optional[int] = None) -> Tuple[bytes, bytes]:
    """``document_key`` and ``index_key_for`` together, the id hashed once (every write needs both; one that
    hashed it already gives its ``shard``)."""
    tag = _tag(collection, shard_of(doc_id) if shard is None else shard)
    return tag + b":d:" + doc_id, tag + b":i"


def index_key(collection: bytes, shard: int) -> bytes:
    """The sorted set that lists the ids of one shard of a collection."""
    return _tag(collection, shard) + b":i"


def index_key_for(collection: bytes, doc_id: bytes) -> bytes:
    """The index shard that lists ``doc_id``."""
    return index_key(collection, shard_of(doc_id))


def feed_key(collection: bytes, shard: int) -> bytes:
    """The capped stream of one shard's changes, in the slot of its documents (``cache.feed.streams``)."""
    return _tag(collection, shard) + b":f"


# Declared indexes' keys: the documents' slot, outside the prefix the hot cache tracks (cache.indexes.scripts).
INDEX_PREFIX = b"ji:"


def index_spec_key(collection: bytes, shard: int) -> bytes:
    """The spec of the declared indexes one shard keeps (``cache.indexes.scripts``)."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":xs"


def index_entries_key(collection: bytes, shard: int, name: bytes, version: bytes) -> bytes:
    """One declared index's entries in one shard (``cache.indexes.scripts``)."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":x:" + name + b":" + version


def index_states_key(collection: bytes, shard: int) -> bytes:
    """Each declared index's state in one shard: built, or where its build is (``cache.indexes.scripts``)."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":xst"


def feed_bytes_key(collection: bytes, shard: int) -> bytes:
    """What one shard's change feed holds, in bytes as its budget counts them (``cache.feed.feed_lua``' trim_feed);
    ``+ b"s"``: each event's count, oldest first."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":fb"


def index_dropped_key(collection: bytes, shard: int) -> bytes:
    """The fields of dropped indexes still in one shard's documents, and how far their sweep is."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":xgc"


def index_build_lease_key(collection: bytes, name: bytes, version: bytes) -> bytes:
    """Which worker builds one declared index (``cache.indexes.builds``): in the slot of the collection's shard 0."""
    return INDEX_PREFIX + _tag(collection, 0)[len(PREFIX) :] + b":xl:" + name + b":" + version


def expiry_key(collection: bytes, shard: int) -> bytes:
    """The ids of one shard's documents that have a TTL, by their expiry in ms (``cache.indexes.expiry_scripts``)."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":xe"


def expiry_marks_key(collection: bytes, shard: int) -> bytes:
    """The index entries of one shard's documents that have a TTL, kept to remove once they expire."""
    return INDEX_PREFIX + _tag(collection, shard)[len(PREFIX) :] + b":xm"


# The collections that may hold documents with a TTL, which the expiry sweepers visit (``cache.documents.expiry``).
EXPIRING = INDEX_PREFIX + b"expiring"
