"""Documents in Redis as the JSON bytes that are sent, read back as bytes.

The key layout is described in ``cache.keys``; every write goes through one
Lua script (``cache.scripts``) so a body, its ETag, its modification time and
its index entry change together. Nothing here parses a stored body except a
merge patch, which has to.
"""

from __future__ import annotations

import email.utils
import heapq
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from twisted.internet import defer
from twisted.python.failure import Failure

from cache import codec, keys, scripts
from cache.errors import (
    DocumentNotFound,
    DocumentTooLarge,
    NotReplicated,
    PreconditionFailed,
    WriteConflict,
)
from cache.hot_cache import HotCache
from cache.ids import EtagFactory, UlidFactory
from cache.link import Link
from cache.merge_patch import merge_patch
from cache.scripts import Script
from cache.write_concern import PRIMARY_ONLY, WriteConcern

_PUT_FAILED, _REPLACED, _CREATED = 0, 1, 2
_DELETE_FAILED, _DELETE_MISSING = 0, -1


@dataclass(frozen=True)
class Document:
    """A stored document: its bytes and the validators stored with them."""

    body: bytes
    etag: bytes
    last_modified: bytes


@dataclass(frozen=True)
class Conditions:
    """Pre-parsed ``If-Match`` / ``If-None-Match``: ``b''``, ``b'*'`` or tags."""

    if_match: bytes = b""
    if_none_match: bytes = b""


@dataclass(frozen=True)
class Page:
    """One page of a collection, and the id to continue after (or None)."""

    bodies: List[bytes]
    last_id: Optional[bytes]


NO_CONDITIONS = Conditions()


class DocumentStore:
    """The document operations of the API, on a ``Link`` (one Redis, Sentinel or Cluster).

    With a ``write_concern`` that waits for replicas, writes go through
    ``write_link`` (a pool of their own: ``WAIT`` blocks its connection).
    With a ``hot`` cache, document reads are served from it when they can
    be and fill it when they may (``cache.hot_cache`` states when), and
    every write drops its document's entry before it is answered.
    """

    def __init__(
        self,
        link: Link,
        clock: Callable[[], float] = time.time,
        patch_attempts: int = 100,
        write_link: Optional[Link] = None,
        write_concern: WriteConcern = PRIMARY_ONLY,
        hot: Optional[HotCache] = None,
    ) -> None:
        if write_concern.waits and write_link is None:
            raise ValueError("a write concern that waits for replicas needs a write link")
        self._link = link
        self._write_link = write_link
        self._write_concern = write_concern
        self._clock = clock
        self._ids = UlidFactory(clock)
        self._etags = EtagFactory()
        self._last_modified: Tuple[int, bytes] = (-1, b"")
        self._patch_attempts = patch_attempts
        self._hot = hot

    def ping(self) -> defer.Deferred:
        """Fires when Redis answers a PING."""
        return self._link.execute(b"PING")

    # The two reads are the hot path: a plain callback costs less than an
    # inlineCallbacks generator (a Deferred, a context copy and a generator
    # per call on PyPy) and reads as well for one step.
    def get(self, collection: bytes, doc_id: bytes, fresh: bool = False) -> defer.Deferred:
        """The document, or None: from the hot cache, else one HMGET of one key.

        ``fresh``: from Redis even if cached (a request's ``Cache-Control: no-cache``).
        """
        key = keys.document_key(collection, doc_id)
        hot = self._hot
        if hot is not None:
            document = None if fresh else hot.get(key)
            if document is not None:
                return defer.succeed(document)
            ticket = hot.reserve(key)
            if ticket is not None:
                return self._link.pipeline(_filling_read(key)).addBoth(self._filled, key, ticket)
        return self._link.execute(*_read_command(key)).addCallback(_document)

    def get_along(
        self,
        collection: bytes,
        doc_id: bytes,
        command: Sequence[Any],
        scripts: Sequence[Any],
        fresh: bool = False,
    ) -> defer.Deferred:
        """``command``'s reply and the document, in one round trip (command first).

        A document in the hot cache is not read: ``command`` goes alone.
        """
        key = keys.document_key(collection, doc_id)
        hot = self._hot
        if hot is not None:
            document = None if fresh else hot.get(key)
            if document is not None:
                return self._link.pipeline_scripts([command], scripts).addCallback(_along, document)
            ticket = hot.reserve(key)
            if ticket is not None:
                read = self._link.pipeline_scripts([command, *_filling_read(key)], scripts)
                return read.addBoth(self._filled_along, key, ticket)
        read = self._link.pipeline_scripts([command, _read_command(key)], scripts)
        return read.addCallback(lambda replies: (replies[0], _document(replies[1])))

    def _filled(self, replies: Any, key: bytes, ticket: int) -> Any:
        """A filling read's outcome: the document, offered to the hot cache."""
        hot = self._hot
        assert hot is not None
        if isinstance(replies, Failure):
            hot.release(key, ticket)
            return replies
        document = _document(replies[0])
        hot.fill(key, ticket, document, replies[1])
        return document

    def _filled_along(self, replies: Any, key: bytes, ticket: int) -> Any:
        if isinstance(replies, Failure):
            return self._filled(replies, key, ticket)
        return replies[0], self._filled(replies[1:], key, ticket)

    def put(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions = NO_CONDITIONS,
        ttl: Optional[int] = None,
    ) -> defer.Deferred:
        """Create or replace; fires with ``(Document, created)``."""
        return self._write(collection, doc_id, body, conditions, b"%d" % (ttl or 0))

    @defer.inlineCallbacks
    def create(self, collection: bytes, body: bytes, ttl: Optional[int] = None) -> Any:
        """Store under a new ULID; fires with ``(id, Document)``."""
        doc_id = self._ids.new().encode()
        try:
            document, _ = yield self.put(collection, doc_id, body, Conditions(if_none_match=b"*"), ttl)
        except NotReplicated as error:
            error.doc_id = doc_id
            raise
        return doc_id, document

    @defer.inlineCallbacks
    def patch(self, collection: bytes, doc_id: bytes, patch: Any, if_match: bytes, max_size: int) -> Any:
        """Merge ``patch`` into the document; retried until no writer races it."""
        key = keys.document_key(collection, doc_id)
        for _ in range(self._patch_attempts):
            body, etag = yield self._link.execute(b"HMGET", key, b"b", b"e")
            if body is None:
                # RFC 9110 13.1.1: If-Match on a missing representation fails.
                raise PreconditionFailed() if if_match else DocumentNotFound()
            if if_match and not _tag_matches(if_match, etag):
                raise PreconditionFailed()
            merged = codec.dumps(merge_patch(codec.loads(body), patch))
            if len(merged) > max_size:
                raise DocumentTooLarge(len(merged))
            try:
                # Compare-and-set on the ETag just read: a concurrent write
                # changes it, and then the merge is redone on the new body.
                document, _ = yield self._write(collection, doc_id, merged, Conditions(if_match=etag), b"")
            except PreconditionFailed:
                continue
            return document
        raise WriteConflict()

    @defer.inlineCallbacks
    def delete(self, collection: bytes, doc_id: bytes, if_match: bytes = b"") -> Any:
        """Delete; raises ``DocumentNotFound`` or ``PreconditionFailed``."""
        result, confirmed = yield self._run_write(
            scripts.DELETE,
            [keys.document_key(collection, doc_id), keys.index_key_for(collection, doc_id)],
            [doc_id, if_match],
        )
        if result == _DELETE_FAILED:
            raise PreconditionFailed()
        if result == _DELETE_MISSING:
            raise DocumentNotFound()
        self._check_replicated(confirmed, None)

    def page(self, collection: bytes, limit: int, after: Optional[bytes]) -> defer.Deferred:
        """Up to ``limit`` bodies in id order, starting after the id ``after``."""
        # Plain callbacks, as the document reads: bodies bound to a generator
        # frame that waited for Redis would be kept by it (README, "The read path").
        start = b"(" + after if after else b"-"
        ranges = self._link.pipeline(
            [
                (b"ZRANGEBYLEX", keys.index_key(collection, shard), start, b"+", b"LIMIT", 0, limit + 1)
                for shard in range(keys.INDEX_SHARDS)
            ]
        )
        return ranges.addCallback(self._read_page, collection, limit)

    def _read_page(self, shards: List[List[bytes]], collection: bytes, limit: int) -> defer.Deferred:
        ids = list(heapq.merge(*shards))[: limit + 1]
        last_id = ids[limit - 1] if len(ids) > limit else None
        ids = ids[:limit]
        return self.get_many(collection, ids).addCallback(self._page_of, collection, ids, last_id)

    def _page_of(
        self, bodies: List[Optional[bytes]], collection: bytes, ids: List[bytes], last_id: Optional[bytes]
    ) -> Page:
        self._prune(collection, [doc_id for doc_id, body in zip(ids, bodies) if body is None])
        return Page([body for body in bodies if body is not None], last_id)

    def get_many(self, collection: bytes, doc_ids: Sequence[bytes]) -> defer.Deferred:
        """The bodies of ``doc_ids`` in order, None where missing: one round trip."""
        if not doc_ids:
            return defer.succeed([])
        return self._link.pipeline([(b"HGET", keys.document_key(collection, doc_id), b"b") for doc_id in doc_ids])

    @defer.inlineCallbacks
    def _write(self, collection: bytes, doc_id: bytes, body: bytes, conditions: Conditions, ttl: bytes) -> Any:
        document = Document(body, self._etags.new(), self._now_as_http_date())
        result, confirmed = yield self._run_write(
            scripts.PUT,
            [keys.document_key(collection, doc_id), keys.index_key_for(collection, doc_id)],
            [
                doc_id,
                body,
                document.etag,
                document.last_modified,
                ttl,
                conditions.if_match,
                conditions.if_none_match,
            ],
        )
        if result == _PUT_FAILED:
            raise PreconditionFailed()
        self._check_replicated(confirmed, document.etag)
        return document, result == _CREATED

    def _run_write(self, script: Script, script_keys: List[bytes], args: List[Any]) -> defer.Deferred:
        """A write script's reply and how many replicas confirmed it (None: not asked)."""
        concern = self._write_concern
        if not concern.waits:
            sent = self._link.run_script(script, script_keys, args).addCallback(lambda reply: (reply, None))
        else:
            assert self._write_link is not None
            sent = self._write_link.run_script_waiting(script, script_keys, args, concern.wait_command())
        if self._hot is not None:
            # Whatever the outcome (a timed-out write may have happened), the
            # document's entry goes before the write is answered: this worker
            # reads its own writes without waiting for Redis's invalidation.
            sent.addBoth(_forgetting, self._hot, script_keys[0])
        return sent

    def _check_replicated(self, confirmed: Optional[int], etag: Optional[bytes]) -> None:
        """Raise ``NotReplicated`` when fewer replicas than the write concern confirmed a write that happened."""
        concern = self._write_concern
        if confirmed is not None and confirmed < concern.replicas:
            raise NotReplicated(confirmed, concern.replicas, concern.timeout, etag)

    def _now_as_http_date(self) -> bytes:
        # Made once a second, not once a write: formatting it (email.utils
        # through datetime) was ~5% of a 200 B PUT on PyPy (vmprof).
        second = int(self._clock())
        if self._last_modified[0] != second:
            self._last_modified = (second, _http_date(second))
        return self._last_modified[1]

    def _prune(self, collection: bytes, stale_ids: List[bytes]) -> None:
        """Drop index entries of expired documents, in the background."""
        by_shard: Dict[int, List[bytes]] = {}
        for doc_id in stale_ids:
            by_shard.setdefault(keys.shard_of(doc_id), []).append(doc_id)
        for shard, ids in by_shard.items():
            doc_keys = [keys.document_key(collection, doc_id) for doc_id in ids]
            pruning = self._link.run_script(scripts.PRUNE, [keys.index_key(collection, shard), *doc_keys], ids)
            # A failed prune only leaves a stale entry that the next page skips.
            pruning.addErrback(lambda _: None)


def _read_command(key: bytes) -> Tuple[bytes, ...]:
    return (b"HMGET", key, b"b", b"e", b"m")


def _filling_read(key: bytes) -> List[Tuple[bytes, ...]]:
    """The read, and the key's expiry for the hot cache's entry (see ``cache.hot_cache``)."""
    return [(b"HMGET", key, b"b", b"e", b"m"), (b"PTTL", key)]


def _along(replies: List[Any], document: Document) -> Tuple[Any, Document]:
    return replies[0], document


def _forgetting(result: Any, hot: HotCache, key: bytes) -> Any:
    hot.written(key)
    return result


def _document(fields: Sequence[Optional[bytes]]) -> Optional[Document]:
    body, etag, modified = fields
    return None if body is None else Document(body, etag, modified)


def _tag_matches(header: bytes, etag: bytes) -> bool:
    return header == b"*" or etag in header.split()


def _http_date(second: int) -> bytes:
    return email.utils.formatdate(second, usegmt=True).encode()
