"""Document writes: create, replace, merge patch and delete, each one Lua script (``cache.documents.scripts``).

One of the parts ``cache.documents.store.DocumentStore`` is made of, given
what it writes with; it makes its documents' ids and ETags. Every write
drops its document's hot-cache entry before it is answered, logs its change
in the feed when there is one (``cache.feed.streams``), and with a write
concern that waits for replicas goes through a pool of its own
(``cache.documents.write_concern``).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from twisted.internet import defer
from twisted.python.failure import Failure

from cache import keys
from cache.documents import scripts
from cache.documents.document import (
    NO_CONDITIONS,
    VARIANT_FIELDS,
    Conditions,
    Document,
    PreparedDelete,
    PreparedPut,
    delete_outcome,
    epoch_of,
    http_date,
    put_outcome,
    tag_matches,
)
from cache.documents.expiry import ExpiringCollections
from cache.documents.ids import EtagFactory, UlidFactory
from cache.documents.variants import FIELDS, Variants
from cache.documents.write_concern import WriteConcern
from cache.documents.write_plan import KEPT, NO_EXPIRY, PLAIN, Planner, WritePlan
from cache.errors import DocumentNotFound, DocumentTooLarge, NotReplicated, PreconditionFailed, WriteConflict
from cache.feed.streams import FeedLog
from cache.hot.cache import HotCache
from cache.indexes.declared import NO_INDEX_ARGS
from cache.json import codec
from cache.json.merge_patch import merge_patch
from cache.redis.link import Link
from cache.redis.script import Script


class DocumentWrites:
    """The writes of ``DocumentStore``, and the script calls they are made of (a batch sends those itself).

    With a ``write_concern`` that waits for replicas, writes go through
    ``write_link`` (a pool of their own: ``WAIT`` blocks its connection).
    """

    def __init__(
        self,
        link: Link,
        write_link: Optional[Link],
        write_concern: WriteConcern,
        clock: Callable[[], float],
        patch_attempts: int,
        hot: Optional[HotCache],
        variants: Variants,
        feed: FeedLog,
        expiring: Optional[ExpiringCollections] = None,
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
        # The registry the expiry sweepers visit (cache.documents.expiry): each collection a write gives a TTL.
        self.expiring = ExpiringCollections(link) if expiring is None else expiring

    def put(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions = NO_CONDITIONS,
        plan: WritePlan = PLAIN,
        etag: Optional[bytes] = None,
    ) -> defer.Deferred:
        """Create or replace; fires with ``(Document, Created)``; ``etag``: a planned one (``new_etag``).

        ``plan``: the collection's settings applied to the document (``cache.documents.write_plan``): its expiry,
        write concern and index entries.
        """
        if conditions.unmodified_since is not None and not conditions.if_match:
            return self._write_unmodified(collection, doc_id, body, conditions, plan)
        return self._write(collection, doc_id, body, conditions, plan.expiry, etag, plan.replicas, indexed=plan.indexed)

    @defer.inlineCallbacks
    def _write_unmodified(
        self,
        collection: bytes,
        doc_id: bytes,
        body: bytes,
        conditions: Conditions,
        plan: WritePlan,
    ) -> Any:
        """A PUT with ``If-Unmodified-Since``: checked against the document read, then compare-and-set on it."""
        checked = yield self._unmodified_condition(collection, doc_id, conditions)
        result = yield self._write(
            collection, doc_id, body, checked, plan.expiry, None, plan.replicas, indexed=plan.indexed
        )
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
        if epoch_of(modified) > conditions.unmodified_since:
            raise PreconditionFailed()
        return Conditions(etag, conditions.if_none_match)

    def new_id(self) -> bytes:
        """A new document id: a ULID, sortable by creation time."""
        return self._ids.new().encode()

    def new_etag(self) -> bytes:
        """The ETag a write will store: planned ahead where a retry must write the same (idempotency)."""
        return self._etags.new()

    @defer.inlineCallbacks
    def create(
        self,
        collection: bytes,
        body: bytes,
        plan: WritePlan = PLAIN,
        doc_id: Optional[bytes] = None,
        etag: Optional[bytes] = None,
    ) -> Any:
        """Store under a new ULID (or the planned ``doc_id``, which ``plan``'s index entries name); fires with
        ``(id, Document)``."""
        doc_id = doc_id or self.new_id()
        try:
            create_only = Conditions(if_none_match=b"*")
            document, _ = yield self._write(
                collection, doc_id, body, create_only, plan.expiry, etag, plan.replicas, b"create", plan.indexed
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
        planner: Planner = lambda value, size: KEPT,
    ) -> Any:
        """Merge ``patch`` into the document; retried until no writer races it.

        With a ``planned_etag`` (an Idempotency-Key's plan), a document that
        already carries it is this patch done before: it is answered as it is.
        ``planner(merged, size)`` makes the merged document's plan (``cache.documents.write_plan.patch_planner``),
        or refuses it (raising) before it is written.
        """
        key = keys.document_key(collection, doc_id)
        for _ in range(self._patch_attempts):
            body, etag, modified = yield self._link.execute(b"HMGET", key, b"b", b"e", b"m")
            if body is not None and planned_etag is not None and etag == planned_etag:
                # Written by an earlier attempt, maybe on another worker:
                # this worker's entry goes as if it had written it.
                if self._hot is not None:
                    self._hot.written(key)
                return Document(body, etag, modified)
            if body is None:
                # RFC 9110 13.1.1: If-Match on a missing representation fails.
                raise PreconditionFailed() if if_match else DocumentNotFound()
            if if_match and not tag_matches(if_match, etag):
                raise PreconditionFailed()
            if not if_match and unmodified_since is not None and epoch_of(modified) > unmodified_since:
                raise PreconditionFailed()
            value = merge_patch(codec.loads(body), patch)
            merged = codec.dumps(value)
            if len(merged) > max_size:
                raise DocumentTooLarge(len(merged))
            plan = planner(value, len(merged))
            try:
                # Compare-and-set on the ETag just read: a concurrent write
                # changes it, and then the merge is redone on the new body.
                written = self._write(
                    collection,
                    doc_id,
                    merged,
                    Conditions(if_match=etag),
                    plan.expiry,
                    planned_etag,
                    plan.replicas,
                    b"patch",
                    plan.indexed,
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
        indexed: Sequence[Any] = NO_INDEX_ARGS,
    ) -> defer.Deferred:
        """The script call that writes, and its outcome. Plain callbacks, as the read (no generator per write)."""
        try:
            write = self.prepare_put(collection, doc_id, body, conditions, ttl, etag, op, indexed)
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
        indexed: Sequence[Any] = NO_INDEX_ARGS,
    ) -> PreparedPut:
        """A create-or-replace as the script call that makes it (``put_outcome`` reads its reply).

        ``ttl``: ``b''`` keeps the expiry, ``b'0'`` removes it, ``b'N'`` sets N seconds.
        ``op``: the operation its change-feed event names (``cache.feed.streams.OPS``).
        ``indexed``: its entries in the collection's declared indexes (``cache.indexes.declared.index_args``).
        """
        if ttl and ttl != NO_EXPIRY:
            self.expiring.note(collection)
        encoded = self._variants.encode(body)
        document = Document(body, etag or self._etags.new(), self._now_as_http_date(), encoded)
        shard = keys.shard_of(doc_id)
        feed_keys, feed_args = self._feed.script_parts(op, collection, shard)
        head = [doc_id, body, document.etag, document.last_modified, ttl, conditions.if_match, conditions.if_none_match]
        if not encoded:  # the usual document, too small to compress: every variant field is an earlier version's
            args = [*head, 0, *indexed, *VARIANT_FIELDS, *feed_args]
        else:
            stored = {FIELDS[coding] for coding, _ in encoded}
            args = [
                *head,
                len(encoded),
                *(part for coding, data in encoded for part in (FIELDS[coding], data)),
                *indexed,
                # Variants an earlier version had and this one has not.
                *(field for field in VARIANT_FIELDS if field not in stored),
                *feed_args,
            ]
        return PreparedPut(document, [*keys.document_and_index_keys(collection, doc_id, shard), *feed_keys], args)

    def prepare_delete(self, collection: bytes, doc_id: bytes, if_match: bytes) -> PreparedDelete:
        """A delete as the script call that makes it (``delete_outcome`` reads its reply)."""
        shard = keys.shard_of(doc_id)
        feed_keys, feed_args = self._feed.script_parts(b"delete", collection, shard)
        return PreparedDelete(
            [*keys.document_and_index_keys(collection, doc_id, shard), *feed_keys], [doc_id, if_match, *feed_args]
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
        # through datetime) is a visible share of a small PUT on PyPy.
        second = int(self._clock())
        if self._last_modified[0] != second:
            self._last_modified = (second, http_date(second))
        return self._last_modified[1]
