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
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from twisted.internet import defer
from twisted.python.failure import Failure

from cache import bounded_reads, codec, keys, scripts
from cache.change_feed import NO_FEED, FeedLog
from cache.errors import (
    DocumentNotFound,
    DocumentTooLarge,
    NotReplicated,
    PreconditionFailed,
    WriteConflict,
)
from cache.hot_cache import HotCache
from cache.ids import EtagFactory, UlidFactory
from cache.merge_patch import merge_patch
from cache.redis.link import Link
from cache.redis.script import Script
from cache.variants import CODINGS, DEFAULT_VARIANTS, FIELDS, Variants
from cache.write_concern import PRIMARY_ONLY, WriteConcern

_PUT_FAILED, _REPLACED, _CREATED = 0, 1, 2
# A write's outcome: whether it created the document; None when this very
# write (its ETag) had been applied before (cache.scripts.PUT).
Created = Optional[bool]
_DELETE_FAILED, _DELETE_MISSING = 0, -1


@dataclass(frozen=True)
class Document:
    """A stored document: its bytes, the validators and the compressed variants stored with them."""

    body: bytes
    etag: bytes
    last_modified: bytes
    # (content coding, encoded bytes) for each variant stored (cache.variants).
    encoded: Tuple[Tuple[str, bytes], ...] = ()

    def variant(self, coding: str) -> Optional[bytes]:
        """The bytes of ``coding``'s variant, or None if none is stored."""
        for name, data in self.encoded:
            if name == coding:
                return data
        return None


@dataclass(frozen=True)
class Conditions:
    """Pre-parsed ``If-Match`` / ``If-None-Match`` (``b''``, ``b'*'`` or tags) and ``If-Unmodified-Since``.

    ``unmodified_since`` (seconds since the epoch) counts only without
    ``if_match`` (RFC 9110 13.2.2) and only for a document that exists.
    """

    if_match: bytes = b""
    if_none_match: bytes = b""
    unmodified_since: Optional[int] = None


@dataclass(frozen=True)
class Page:
    """One page of a collection, and the id to continue after (or None)."""

    bodies: List[Any]  # bytes, or memoryviews of a Redis reply (cache.bounded_reads)
    last_id: Optional[bytes]


NO_CONDITIONS = Conditions()


@dataclass(frozen=True)
class PreparedPut:
    """A create-or-replace ready to send: the document it stores and ``scripts.PUT``'s keys and arguments."""

    document: Document
    keys: List[bytes]
    args: List[Any]

    def command(self) -> Tuple[Any, ...]:
        return scripts.PUT.call(self.keys, self.args)


@dataclass(frozen=True)
class PreparedDelete:
    """A delete ready to send: ``scripts.DELETE``'s keys and arguments."""

    keys: List[bytes]
    args: List[Any]

    def command(self) -> Tuple[Any, ...]:
        return scripts.DELETE.call(self.keys, self.args)


def put_outcome(write: PreparedPut, result: Any) -> Tuple[Document, Created]:
    """What ``scripts.PUT`` answered: the document stored and whether it was created; or ``PreconditionFailed``."""
    if isinstance(result, list):
        # Applied before, by an earlier attempt at this very write: as it was then.
        return replace(write.document, last_modified=result[1]), None
    if result == _PUT_FAILED:
        raise PreconditionFailed()
    return write.document, result == _CREATED


def delete_outcome(result: Any) -> None:
    """What ``scripts.DELETE`` answered: nothing, or ``PreconditionFailed`` / ``DocumentNotFound``."""
    if result == _DELETE_FAILED:
        raise PreconditionFailed()
    if result == _DELETE_MISSING:
        raise DocumentNotFound()


class DocumentStore:
    """The document operations of the API, on a ``Link`` (one Redis, Sentinel or Cluster).

    With a ``write_concern`` that waits for replicas, writes go through
    ``write_link`` (a pool of their own: ``WAIT`` blocks its connection).
    With a ``hot`` cache, document reads are served from it when they can
    be and fill it when they may (``cache.hot_cache`` states when), and
    every write drops its document's entry before it is answered.
    With a ``feed``, every write script also logs its change
    (``cache.change_feed``); ``op`` names the operation it logs.
    """

    def __init__(
        self,
        link: Link,
        clock: Callable[[], float] = time.time,
        patch_attempts: int = 100,
        write_link: Optional[Link] = None,
        write_concern: WriteConcern = PRIMARY_ONLY,
        hot: Optional[HotCache] = None,
        variants: Variants = DEFAULT_VARIANTS,
        feed: FeedLog = NO_FEED,
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
        self._variants = variants
        self._feed = feed

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
        found = self.get_or_wait(collection, doc_id, fresh)
        return defer.succeed(found) if isinstance(found, Document) else found

    def get_or_wait(self, collection: bytes, doc_id: bytes, fresh: bool = False) -> Union[Document, defer.Deferred]:
        """``get``, with a document the hot cache holds given at once rather than in a fired Deferred."""
        key = keys.document_key(collection, doc_id)
        hot = self._hot
        if hot is not None:
            document = None if fresh else hot.get(key)
            if document is not None:
                return document
            ticket = hot.reserve(key)
            if ticket is not None:
                return self._link.pipeline(_filling_read(key)).addBoth(self._filled, key, ticket)
        return self._link.execute(*_read_key(key)).addCallback(stored_document)

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
        read = self._link.pipeline_scripts([command, _read_key(key)], scripts)
        return read.addCallback(lambda replies: (replies[0], stored_document(replies[1])))

    def cached(self, collection: bytes, doc_id: bytes) -> Optional[Document]:
        """The document if this worker's hot cache holds it (None: not held, or no cache)."""
        hot = self._hot
        return None if hot is None else hot.get(keys.document_key(collection, doc_id))

    def hot_hit(self, collection: bytes, doc_id: bytes) -> Optional[Document]:
        """The document if the hot cache holds it, counted as a hit; else None, not counted (``get_or_wait`` will)."""
        hot = self._hot
        return None if hot is None else hot.hit(keys.document_key(collection, doc_id))

    def forget(self, collection: bytes, doc_id: bytes) -> None:
        """Drop the document's hot-cache entry: it has been written, here or elsewhere (a replay's)."""
        if self._hot is not None:
            self._hot.written(keys.document_key(collection, doc_id))

    def forgetting(self, sent: defer.Deferred, doc_keys: Sequence[bytes]) -> defer.Deferred:
        """``sent`` (writes of ``doc_keys``): their hot-cache entries go before its callbacks, whatever the outcome."""
        if self._hot is not None:
            for key in doc_keys:
                sent.addBoth(_forgetting, self._hot, key)
        return sent

    def _filled(self, replies: Any, key: bytes, ticket: int) -> Any:
        """A filling read's outcome: the document, offered to the hot cache."""
        hot = self._hot
        assert hot is not None
        if isinstance(replies, Failure):
            hot.release(key, ticket)
            return replies
        document = stored_document(replies[0])
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
        etag: Optional[bytes] = None,
        replicas: Optional[int] = None,
    ) -> defer.Deferred:
        """Create or replace; fires with ``(Document, Created)``; ``etag``: a planned one (``new_etag``).

        ``replicas``: the collection's own write concern (None: the store's).
        """
        if conditions.unmodified_since is not None and not conditions.if_match:
            return self._write_unmodified(collection, doc_id, body, conditions, ttl, replicas)
        return self._write(collection, doc_id, body, conditions, b"%d" % (ttl or 0), etag, replicas)

    @defer.inlineCallbacks
    def _write_unmodified(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions,
        ttl: Optional[int],
        replicas: Optional[int] = None,
    ) -> Any:
        """A PUT with ``If-Unmodified-Since``: checked against the document read, then compare-and-set on it."""
        checked = yield self._unmodified_condition(collection, doc_id, conditions)
        result = yield self._write(collection, doc_id, body, checked, b"%d" % (ttl or 0), None, replicas)
        return result

    @defer.inlineCallbacks
    def _unmodified_condition(self, collection: bytes, doc_id: bytes, conditions: Conditions) -> Any:
        """``conditions`` with ``If-Unmodified-Since`` turned into an exact ``If-Match`` (or create-only).

        The date is checked against the document as read; the write then
        happens only if the document is still that one (a writer that came
        in between changed it later than the date, so the write fails as
        the date would have failed it).
        """
        etag, modified = yield self._link.execute(b"HMGET", keys.document_key(collection, doc_id), b"e", b"m")
        if etag is None:
            # No modification date to compare: the condition is ignored, but
            # a document created meanwhile must not be overwritten unseen.
            return Conditions(b"", conditions.if_none_match or b"*")
        assert conditions.unmodified_since is not None
        if _epoch_of(modified) > conditions.unmodified_since:
            raise PreconditionFailed()
        return Conditions(etag, conditions.if_none_match)

    def new_id(self) -> bytes:
        """A new document id: a ULID, sortable by creation time."""
        return self._ids.new().encode()

    def new_etag(self) -> bytes:
        """The ETag a write will store: planned ahead where a retry must write the same (cache.idempotency)."""
        return self._etags.new()

    @defer.inlineCallbacks
    def create(
        self,
        collection: bytes,
        body: bytes,
        ttl: Optional[int] = None,
        doc_id: Optional[bytes] = None,
        etag: Optional[bytes] = None,
        replicas: Optional[int] = None,
    ) -> Any:
        """Store under a new ULID (or the planned ``doc_id``); fires with ``(id, Document)``."""
        doc_id = doc_id or self.new_id()
        try:
            document, _ = yield self._write(
                collection, doc_id, body, Conditions(if_none_match=b"*"), b"%d" % (ttl or 0), etag, replicas, b"create"
            )
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
        unmodified_since: Optional[int] = None,
        planned_etag: Optional[bytes] = None,
        check: Optional[Callable[[Any, int], None]] = None,
        replicas: Optional[int] = None,
    ) -> Any:
        """Merge ``patch`` into the document; retried until no writer races it.

        With a ``planned_etag`` (an Idempotency-Key's plan), a document that
        already carries it is this patch done before: it is answered as it is.
        ``check(merged, size)`` may refuse the merged document (raising) before it is written.
        """
        key = keys.document_key(collection, doc_id)
        for _ in range(self._patch_attempts):
            body, etag, modified = yield self._link.execute(b"HMGET", key, b"b", b"e", b"m")
            if body is not None and planned_etag is not None and etag == planned_etag:
                # Written by an earlier attempt, maybe on another worker:
                # this worker's entry goes as if it had written it.
                self.forget(collection, doc_id)
                return Document(body, etag, modified)
            if body is None:
                # RFC 9110 13.1.1: If-Match on a missing representation fails.
                raise PreconditionFailed() if if_match else DocumentNotFound()
            if if_match and not _tag_matches(if_match, etag):
                raise PreconditionFailed()
            if not if_match and unmodified_since is not None and _epoch_of(modified) > unmodified_since:
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
                written = self._write(
                    collection, doc_id, merged, Conditions(if_match=etag), b"", planned_etag, replicas, b"patch"
                )
                document, _ = yield written
            except PreconditionFailed:
                continue
            return document
        raise WriteConflict()

    @defer.inlineCallbacks
    def delete(
        self,
        collection: bytes,
        doc_id: bytes,
        if_match: bytes = b"",
        unmodified_since: Optional[int] = None,
        replicas: Optional[int] = None,
    ) -> Any:
        """Delete; raises ``DocumentNotFound`` or ``PreconditionFailed``."""
        if unmodified_since is not None and not if_match:
            checked = yield self._unmodified_condition(
                collection, doc_id, Conditions(unmodified_since=unmodified_since)
            )
            if checked.if_none_match:
                raise DocumentNotFound()
            if_match = checked.if_match
        write = self.prepare_delete(collection, doc_id, if_match)
        concern = self._concern(replicas)
        result, confirmed = yield self._run_write(scripts.DELETE, write.keys, write.args, concern)
        delete_outcome(result)
        self._check_replicated(confirmed, None, concern)

    def page(
        self, collection: bytes, limit: int, after: Optional[bytes], budget: int = bounded_reads.DEFAULT_BUDGET
    ) -> defer.Deferred:
        """Up to ``limit`` bodies in id order, starting after the id ``after``; fewer when ``budget`` bytes are met."""
        # Plain callbacks, as the document reads: bodies bound to a generator
        # frame that waited for Redis would be kept by it
        # (docs/performance.md, "The read path: what made it faster").
        start = b"(" + after if after else b"-"
        ranges = self._link.pipeline(
            [
                (b"ZRANGEBYLEX", keys.index_key(collection, shard), start, b"+", b"LIMIT", 0, limit + 1)
                for shard in range(keys.INDEX_SHARDS)
            ]
        )
        return ranges.addCallback(self._read_page, collection, limit, budget)

    def _read_page(self, shards: List[List[bytes]], collection: bytes, limit: int, budget: int) -> defer.Deferred:
        ids = list(heapq.merge(*shards))[: limit + 1]
        more = len(ids) > limit
        ids = ids[:limit]
        read = bounded_reads.read_within(self._link, collection, ids, [1] * len(ids), budget, cut=True)
        return read.addCallback(self._page_of, collection, ids, more)

    def _page_of(self, read: Tuple[List[Any], int], collection: bytes, ids: List[bytes], more: bool) -> Page:
        bodies, covered = read
        # A page the budget ended early continues after its last id, as a full one does.
        last_id = ids[covered - 1] if more or covered < len(ids) else None
        self._prune(collection, [doc_id for doc_id, body in zip(ids, bodies) if body is None])
        return Page([body for body in bodies if body is not None], last_id)

    def get_many(
        self, collection: bytes, doc_ids: Sequence[bytes], budget: int = bounded_reads.DEFAULT_BUDGET
    ) -> defer.Deferred:
        """The bodies of ``doc_ids`` in order, None where missing; ``OverBudget`` past ``budget`` bytes.

        Each distinct id is read once, and counted in the budget as many
        times as it is asked (the answer repeats it): ``cache.bounded_reads``.
        """
        if not doc_ids:
            return defer.succeed([])
        asked: Dict[bytes, int] = {}
        for doc_id in doc_ids:
            asked[doc_id] = asked.get(doc_id, 0) + 1
        distinct = list(asked)
        read = bounded_reads.read_within(self._link, collection, distinct, list(asked.values()), budget)
        return read.addCallback(_in_asked_order, distinct, doc_ids)

    def _write(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions,
        ttl: bytes,
        etag: Optional[bytes] = None,
        replicas: Optional[int] = None,
        op: bytes = b"put",
    ) -> defer.Deferred:
        """The script call that writes, and its outcome. Plain callbacks, as the read (no generator per write)."""
        try:
            write = self.prepare_put(collection, doc_id, body, conditions, ttl, etag, op)
            concern = self._concern(replicas)
            sent = self._send_write(scripts.PUT, write.keys, write.args, concern)
        except Exception:
            return defer.fail()
        # One callback for the reply and the hot cache, not one each: every PUT runs it.
        return sent.addBoth(self._written, write, concern)

    def _written(self, reply: Any, write: PreparedPut, concern: WriteConcern) -> Any:
        reply = self._wrote(reply, write.keys[0], concern.waits)
        if isinstance(reply, Failure):
            return reply
        result, confirmed = reply
        outcome = put_outcome(write, result)
        if outcome[1] is not None:
            self._check_replicated(confirmed, write.document.etag, concern)
        return outcome

    def prepare_put(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions,
        ttl: bytes,
        etag: Optional[bytes] = None,
        op: bytes = b"put",
    ) -> PreparedPut:
        """A create-or-replace as the script call that makes it (``put_outcome`` reads its reply).

        ``ttl``: ``b''`` keeps the expiry, ``b'0'`` removes it, ``b'N'`` sets N seconds.
        ``op``: the operation its change-feed event names (``cache.change_feed.OPS``).
        """
        encoded = self._variants.encode(body)
        document = Document(body, etag or self._etags.new(), self._now_as_http_date(), encoded)
        stored = {FIELDS[coding] for coding, _ in encoded}
        args = [
            doc_id,
            body,
            document.etag,
            document.last_modified,
            ttl,
            conditions.if_match,
            conditions.if_none_match,
            len(encoded),
            *(part for coding, data in encoded for part in (FIELDS[coding], data)),
            # Variants an earlier version had and this one has not.
            *(field for field in _VARIANT_FIELDS if field not in stored),
            *self._feed.script_args(op, collection, doc_id),
        ]
        return PreparedPut(
            document,
            [*keys.document_and_index_keys(collection, doc_id), *self._feed.script_keys(collection, doc_id)],
            args,
        )

    def prepare_delete(self, collection: bytes, doc_id: bytes, if_match: bytes) -> PreparedDelete:
        """A delete as the script call that makes it (``delete_outcome`` reads its reply)."""
        return PreparedDelete(
            [*keys.document_and_index_keys(collection, doc_id), *self._feed.script_keys(collection, doc_id)],
            [doc_id, if_match, *self._feed.script_args(b"delete", collection, doc_id)],
        )

    def _concern(self, replicas: Optional[int]) -> WriteConcern:
        """The store's write concern, or a collection's own number of replicas with the same timeout."""
        if replicas is None or replicas == self._write_concern.replicas:
            return self._write_concern
        return WriteConcern(replicas, self._write_concern.timeout)

    def _run_write(
        self, script: Script, script_keys: List[bytes], args: List[Any], concern: WriteConcern
    ) -> defer.Deferred:
        """A write script's reply and how many replicas confirmed it (None: not asked)."""
        return self._send_write(script, script_keys, args, concern).addBoth(self._wrote, script_keys[0], concern.waits)

    def _send_write(
        self, script: Script, script_keys: List[bytes], args: List[Any], concern: WriteConcern
    ) -> defer.Deferred:
        """The script call, with a ``WAIT`` after it when ``concern`` waits: its raw reply (``_wrote`` reads it)."""
        if not concern.waits:
            return self._link.run_script(script, script_keys, args)
        if self._write_link is None:
            raise ValueError("a write concern that waits for replicas needs a write link")
        return self._write_link.run_script_waiting(script, script_keys, args, concern.wait_command())

    def _wrote(self, reply: Any, doc_key: bytes, waited: bool) -> Any:
        """The reply as ``(result, replicas confirmed or None)``, or its Failure; the hot cache's entry dropped."""
        # Whatever the outcome (a timed-out write may have happened), the
        # document's entry goes before the write is answered: this worker
        # reads its own writes without waiting for Redis's invalidation.
        if self._hot is not None:
            self._hot.written(doc_key)
        if waited or isinstance(reply, Failure):
            return reply
        return reply, None

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


_VARIANT_FIELDS = tuple(FIELDS.values())


def _filling_read(key: bytes) -> List[Tuple[bytes, ...]]:
    """The read, and the key's expiry for the hot cache's entry (see ``cache.hot_cache``)."""
    return [_read_key(key), (b"PTTL", key)]


def _in_asked_order(read: Tuple[List[Any], int], distinct: List[bytes], doc_ids: Sequence[bytes]) -> List[Any]:
    by_id = dict(zip(distinct, read[0]))
    return [by_id[doc_id] for doc_id in doc_ids]


def _along(replies: List[Any], document: Document) -> Tuple[Any, Document]:
    return replies[0], document


def _forgetting(result: Any, hot: HotCache, key: bytes) -> Any:
    hot.written(key)
    return result


def read_command(collection: bytes, doc_id: bytes) -> Tuple[bytes, ...]:
    """The document's read (``stored_document`` reads its reply)."""
    return _read_key(keys.document_key(collection, doc_id))


def _read_key(key: bytes) -> Tuple[bytes, ...]:
    # Every variant comes along: one round trip whatever the client accepts,
    # and a whole document for whoever keeps it (the hot cache too).
    return (b"HMGET", key, b"b", b"e", b"m", *_VARIANT_FIELDS)


def stored_document(fields: Sequence[Optional[bytes]]) -> Optional[Document]:
    body, etag, modified = fields[0], fields[1], fields[2]
    if body is None:
        return None
    if fields[3] is None and len(fields) == 4:
        return Document(body, etag, modified)  # the common case: one coding, not stored
    encoded = tuple((coding, data) for coding, data in zip(CODINGS, fields[3:]) if data is not None)
    return Document(body, etag, modified, encoded)


def _tag_matches(header: bytes, etag: bytes) -> bool:
    return header == b"*" or etag in header.split()


def _http_date(second: int) -> bytes:
    return email.utils.formatdate(second, usegmt=True).encode()


def _epoch_of(http_date: bytes) -> int:
    """A stored ``Last-Modified`` (always IMF-fixdate, made by ``_http_date``) in seconds."""
    return int(email.utils.mktime_tz(email.utils.parsedate_tz(http_date.decode("ascii"))))
