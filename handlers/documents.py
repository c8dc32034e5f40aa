"""``/v1/{coll}/{id}``: read, replace, merge-patch and delete one document."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from twisted.internet import defer

from cache.store import Conditions, Document
from cache.variants import base_tag
from handlers.base import ResourceHandler, document_response
from handlers.http import conditional, validation
from handlers.http.deferreds import is_deferred
from handlers.http.errors import not_found
from handlers.idempotency import respond_once


class DocumentHandler(ResourceHandler):
    ROUTE = "document"
    SUPPORTED_METHODS = ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")

    def get(self, collection: str, doc_id: str) -> Optional[defer.Deferred]:
        # Plain callbacks, not a generator: a request waiting for Redis is
        # usually moved to PyPy's old generation by a minor collection, its
        # generator's frame with it, and a document bound to that frame's
        # locals would then be kept through the next minor collection and
        # copied to the old generation, though the response has long been
        # sent (docs/performance.md, "The read path").
        name = validation.collection_name(collection)
        read = self.read_document(name, validation.document_id(doc_id))
        if is_deferred(read):
            return self.with_collection_policy(name, read).addCallback(self._answer_read)
        if self.use_known_policy(name):  # the usual hot read: answered now, no Deferred made or run
            self._answer_read(read)
            return None
        return self.with_collection_policy(name, defer.succeed(read)).addCallback(self._answer_read)

    def _answer_read(self, document: Optional[Document]) -> None:
        if document is None:
            raise not_found()
        self.send_representation(document)

    head = get

    def put(self, collection: str, doc_id: str) -> defer.Deferred:
        # Plain callbacks, as the read: an inlineCallbacks generator cost a
        # copied contextvars context and a generator step per yield.
        handed = self.handed()
        if handed is not None:  # the direct write made it (handlers/direct_write.py): its outcome, not a second write
            return defer.maybeDeferred(handed.fired).addCallback(self._answer_write)
        keys = validation.collection_name(collection), validation.document_id(doc_id)
        value = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, self.max_body
        )
        ttl = validation.ttl(self.query_argument("ttl"))
        known = self.known_collection_settings(keys[0])
        if known is not None:  # the usual case: no Deferred to wait on, nor one to chain
            return self._put_checked(known, keys, value, ttl)
        return self.collection_settings(keys[0]).addCallback(self._put_checked, keys, value, ttl)

    def _put_checked(self, rules: Any, keys: Any, value: Any, ttl: Optional[int]) -> defer.Deferred:
        rules.check(value, len(self.request.body))  # before anything is stored
        conditions = Conditions(
            self._if_match(),
            validation.entity_tags(self.request.headers.get("If-None-Match"), weak=True),
            self._if_unmodified_since(),
        )
        written = self.store.put(
            *keys, self.request.body, conditions, rules.ttl_or_default(ttl), replicas=rules.write_replicas
        )
        return written.addCallback(self._answer_write)

    def _answer_write(self, outcome: Tuple[Document, bool]) -> None:
        document, created = outcome
        self.send_document(201 if created else 200, document)

    def patch(self, collection: str, doc_id: str) -> defer.Deferred:
        keys = validation.collection_name(collection), validation.document_id(doc_id)
        patch = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.MERGE_PATCH_JSON, self.max_body
        )
        conditions = self._if_match(), self.max_body, self._if_unmodified_since()
        # The ETag is chosen before anything is written: an Idempotency-Key's
        # retry finds the document carrying it if the first attempt wrote it.
        return respond_once(
            self, self.store.new_etag(), lambda etag: self._patch(keys, patch, conditions, etag), [keys]
        )

    @defer.inlineCallbacks
    def _patch(self, keys: Any, patch: Any, conditions: Any, etag: bytes) -> Any:
        # Inside the Idempotency-Key's claim: a schema violation (422) is
        # this request's answer, recorded and replayed like a 412.
        rules = yield self.collection_settings(keys[0])
        # The merged document is checked inside the store's compare-and-set loop, before it is written.
        document = yield self.store.patch(
            *keys, patch, *conditions, planned_etag=etag, check=rules.check, replicas=rules.write_replicas
        )
        return document_response(200, document)

    @defer.inlineCallbacks
    def delete(self, collection: str, doc_id: str) -> Any:
        keys = validation.collection_name(collection), validation.document_id(doc_id)
        rules = yield self.collection_settings(keys[0])
        yield self.store.delete(*keys, self._if_match(), self._if_unmodified_since(), rules.write_replicas)
        self.send_no_content()

    def _if_match(self) -> bytes:
        # A client that read a compressed variant holds that variant's tag;
        # it names the same document.
        tags = validation.entity_tags(self.request.headers.get("If-Match"), weak=False)
        return tags if tags in (b"", b"*") else b" ".join(base_tag(tag) for tag in tags.split())

    def _if_unmodified_since(self) -> Optional[int]:
        return conditional.http_date(self.request.headers.get("If-Unmodified-Since"))
