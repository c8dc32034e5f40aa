"""The Redis key layout, designed for one Redis and for Redis Cluster alike.

A document and the index entry that lists it must change together, in one
Lua script, so they share a hash slot; yet the documents of one big
collection must spread over the nodes of a cluster. So each collection is cut
into ``INDEX_SHARDS`` shards by a CRC32 of the document id, and the shard
(not the collection) is the hash tag:

    jw:{<coll>:<shard>}:d:<id>   HASH   b = body bytes, e = ETag, m = Last-Modified
    jw:{<coll>:<shard>}:i        ZSET   the ids of that shard, all score 0

``<shard>`` is two hex digits. Collection names and ids cannot contain
``{`` or ``}`` (see the route patterns), so no other hash tag can appear.
Listing a collection reads the ``INDEX_SHARDS`` indexes by lexical range
and merges them; a read of one document is one ``HMGET`` of one key.
Changing ``INDEX_SHARDS`` changes where documents live: it is part of the
stored format, not a tuning knob.
"""

from __future__ import annotations

import zlib

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


def index_key(collection: bytes, shard: int) -> bytes:
    """The sorted set that lists the ids of one shard of a collection."""
    return _tag(collection, shard) + b":i"


def index_key_for(collection: bytes, doc_id: bytes) -> bytes:
    """The index shard that lists ``doc_id``."""
    return index_key(collection, shard_of(doc_id))
