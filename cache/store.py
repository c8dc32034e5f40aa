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

from cache import codec, keys, scripts
from cache.errors import (
    DocumentNotFound,
    DocumentTooLarge,
    NotReplicated,
    PreconditionFailed,
    WriteConflict,
)
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
    """

    def __init__(
        self,
        link: Link,
        clock: Callable[[], float] = time.time,
        patch_attempts: int = 100,
        write_link: Optional[Link] = None,
        write_concern: WriteConcern = PRIMARY_ONLY,
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

    def ping(self) -> defer.Deferred:
        """Fires when Redis answers a PING."""
        return self._link.execute(b"PING")

    # The two reads are the hot path: a plain callback costs less than an
    # inlineCallbacks generator (a Deferred, a context copy and a generator
    # per call on PyPy) and reads as well for one step.
    def get(self, collection: bytes, doc_id: bytes) -> defer.Deferred:
        """The document, or None: one HMGET of one key."""
        return self._link.execute(*_read_command(collection, doc_id)).addCallback(_document)

    def get_along(
        self, collection: bytes, doc_id: bytes, command: Sequence[Any], scripts: Sequence[Any]
    ) -> defer.Deferred:
        """``command``'s reply and the document, in one round trip (command first)."""
        read = self._link.pipeline_scripts([command, _read_command(collection, doc_id)], scripts)
        return read.addCallback(lambda replies: (replies[0], _document(replies[1])))

    def put(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions = NO_CONDITIONS,
        ttl: Optional[int] = None,
        replicas: Optional[int] = None,
    ) -> defer.Deferred:
        """Create or replace; fires with ``(Document, created)``.

        ``replicas``: the collection's own write concern (None: the store's).
        """
        return self._write(collection, doc_id, body, conditions, b"%d" % (ttl or 0), replicas)

    @defer.inlineCallbacks
    def create(self, collection: bytes, body: bytes, ttl: Optional[int] = None, replicas: Optional[int] = None) -> Any:
        """Store under a new ULID; fires with ``(id, Document)``."""
        doc_id = self._ids.new().encode()
        try:
            document, _ = yield self.put(collection, doc_id, body, Conditions(if_none_match=b"*"), ttl, replicas)
        except NotReplicated as error:
            error.doc_id = doc_id
            raise
        return doc_id, document

    @defer.inlineCallbacks
    def patch(
        self,
        collection: bytes,
        doc_id: bytes,
        patch: Any,
        if_match: bytes,
        max_size: int,
        check: Optional[Callable[[Any, int], None]] = None,
        replicas: Optional[int] = None,
    ) -> Any:
        """Merge ``patch`` into the document; retried until no writer races it.

        ``check(merged, size)`` may refuse the merged document (raising) before it is written.
        """
        key = keys.document_key(collection, doc_id)
        for _ in range(self._patch_attempts):
            body, etag = yield self._link.execute(b"HMGET", key, b"b", b"e")
            if body is None:
                # RFC 9110 13.1.1: If-Match on a missing representation fails.
                raise PreconditionFailed() if if_match else DocumentNotFound()
            if if_match and not _tag_matches(if_match, etag):
                raise PreconditionFailed()
            value = merge_patch(codec.loads(body), patch)
            merged = codec.dumps(value)
            if len(merged) > max_size:
                raise DocumentTooLarge(len(merged))
            if check is not None:
                check(value, len(merged))
            try:
                # Compare-and-set on the ETag just read: a concurrent write
                # changes it, and then the merge is redone on the new body.
                document, _ = yield self._write(collection, doc_id, merged, Conditions(if_match=etag), b"", replicas)
            except PreconditionFailed:
                continue
            return document
        raise WriteConflict()

    @defer.inlineCallbacks
    def delete(self, collection: bytes, doc_id: bytes, if_match: bytes = b"", replicas: Optional[int] = None) -> Any:
        """Delete; raises ``DocumentNotFound`` or ``PreconditionFailed``."""
        concern = self._concern(replicas)
        result, confirmed = yield self._run_write(
            scripts.DELETE,
            [keys.document_key(collection, doc_id), keys.index_key_for(collection, doc_id)],
            [doc_id, if_match],
            concern,
        )
        if result == _DELETE_FAILED:
            raise PreconditionFailed()
        if result == _DELETE_MISSING:
            raise DocumentNotFound()
        self._check_replicated(confirmed, None, concern)

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
    def _write(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions,
        ttl: bytes,
        replicas: Optional[int] = None,
    ) -> Any:
        document = Document(body, self._etags.new(), self._now_as_http_date())
        concern = self._concern(replicas)
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
            concern,
        )
        if result == _PUT_FAILED:
            raise PreconditionFailed()
        self._check_replicated(confirmed, document.etag, concern)
        return document, result == _CREATED

    def _concern(self, replicas: Optional[int]) -> WriteConcern:
        """The store's write concern, or a collection's own number of replicas with the same timeout."""
        if replicas is None or replicas == self._write_concern.replicas:
            return self._write_concern
        return WriteConcern(replicas, self._write_concern.timeout)

    def _run_write(
        self, script: Script, script_keys: List[bytes], args: List[Any], concern: WriteConcern
    ) -> defer.Deferred:
        """A write script's reply and how many replicas confirmed it (None: not asked)."""
        if not concern.waits:
            return self._link.run_script(script, script_keys, args).addCallback(lambda reply: (reply, None))
        if self._write_link is None:
            raise ValueError("a write concern that waits for replicas needs a write link")
        return self._write_link.run_script_waiting(script, script_keys, args, concern.wait_command())

    def _check_replicated(self, confirmed: Optional[int], etag: Optional[bytes], concern: WriteConcern) -> None:
        """Raise ``NotReplicated`` when fewer replicas than the write concern confirmed a write that happened."""
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


def _read_command(collection: bytes, doc_id: bytes) -> Tuple[bytes, ...]:
    return (b"HMGET", keys.document_key(collection, doc_id), b"b", b"e", b"m")


def _document(fields: Sequence[Optional[bytes]]) -> Optional[Document]:
    body, etag, modified = fields
    return None if body is None else Document(body, etag, modified)


def _tag_matches(header: bytes, etag: bytes) -> bool:
    return header == b"*" or etag in header.split()


def _http_date(second: int) -> bytes:
    return email.utils.formatdate(second, usegmt=True).encode()
