"""``/v1/{coll}/{id}``: read, replace, merge-patch and delete one document."""

from __future__ import annotations

from typing import Any, Dict, Optional

from twisted.internet import defer

from cache.documents.document import Conditions
from cache.documents.write_plan import keeping, patch_planner
from cache.errors import DocumentNotFound
from handlers.base import ResourceHandler, document_response
from handlers.document_answers import DocumentAnswers, if_match, if_unmodified_since
from handlers.http import validation
from handlers.http.deferreds import is_deferred
from handlers.idempotency import respond_once
from handlers.ownership import bound_owner, keeping_owner, pinned, visible_document
from handlers.pipeline import Exchange, Pipeline, run


class DocumentHandler(ResourceHandler):
    """GET, HEAD and PUT run their pipelines (``handlers.document_answers``); PATCH and DELETE are methods."""

    ROUTE = "document"

    def initialize(self, answers: DocumentAnswers, pipelines: Dict[str, Pipeline], **resources: Any) -> None:
        """``pipelines``: the operation table's for this route (``handlers.operation.routes``), bound to ``answers``."""
        super().initialize(**resources)
        self.pipelines = pipelines

    def prepare(self) -> Optional[defer.Deferred]:
        if self.request.method in self.pipelines:
            return None  # admission is the pipeline's first step
        return super().prepare()

    def get(self, collection: str, doc_id: str) -> Optional[defer.Deferred]:
        """The same pipeline the connection runs for a request it answers itself (``handlers.pipeline``)."""
        request = self.request
        operation = self.declared.get(request.method)
        exchange = Exchange(
            request.method,
            request.path,
            request.query,
            self.path_args,
            request.headers,
            request.body,
            self.request_id,
            operation.scope if operation is not None else "admin",
            trace=self.trace,
        )
        reply = run(self.pipelines[request.method], exchange)
        if is_deferred(reply):
            return reply.addCallback(self.send_reply)
        self.send_reply(reply)
        return None

    head = put = get

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
        planner = patch_planner(rules, keys[1])
        owner = bound_owner(self.grant, rules)
        if owner is not None:  # its own document only, pinned to the version whose owner was checked
            current = yield self._owned(keys, owner, rules)
            if_match = pinned(Conditions(conditions[0], b"", conditions[2]), current).if_match
            conditions = if_match, conditions[1], None
            planner = keeping_owner(rules, owner, planner)
        # The merged document is planned (checked) inside the store's compare-and-set loop, before it is written.
        document = yield self.store.patch(*keys, patch, *conditions, planned_etag=etag, planner=planner)
        return document_response(200, document)

    @defer.inlineCallbacks
    def _owned(self, keys: Any, owner: str, rules: Any) -> Any:
        """The document as stored, if ``owner``'s; else the 404 of a missing one (existence is not told)."""
        current = yield self.store.get(*keys, fresh=True)
        if current is None or not visible_document(rules.owner, owner, current):
            raise DocumentNotFound()
        return current

    @defer.inlineCallbacks
    def delete(self, collection: str, doc_id: str) -> Any:
        keys = validation.collection_name(collection), validation.document_id(doc_id)
        rules = yield self.collection_settings(keys[0])
        if_match, since = self._if_match(), self._if_unmodified_since()
        owner = bound_owner(self.grant, rules)
        if owner is not None:
            current = yield self._owned(keys, owner, rules)
            if_match, since = pinned(Conditions(if_match, b"", since), current).if_match, None
        yield self.store.delete(*keys, if_match, since, keeping(rules).replicas)
        self.send_no_content()

    def _if_match(self) -> bytes:
        return if_match(self.request.headers)

    def _if_unmodified_since(self) -> Optional[int]:
        return if_unmodified_since(self.request.headers)
