"""The direct write: a document ``PUT`` answered before any Cyclone object is made.

What ``handlers.direct_read`` does for reads, for the plain replace: a
``PUT /v1/{collection}/{id}`` with no query (so no ``?ttl``), no condition
(``If-Match``, ``If-None-Match``, ``If-Unmodified-Since``), a token this
worker already knows valid with write scope and no rate, and the
collection's settings known. Its body is checked as ``DocumentHandler``
checks it (the media type, the size, JSON syntax, an object, the
collection's limits and schema), written with ``DocumentStore.put`` (the
collection's TTL and write concern), and the 201 or 200 is written by the
connection with the handler's bytes.

Anything that is not such a request, or fails a check, goes the full way
through ``DocumentHandler``, which checks it again and says why: no Redis
was asked. A write that was sent and failed (a Redis error, a write concern
not met) or that the connection can no longer answer itself is handed to
the handler with its outcome (``DirectAnswer.outcome``): it answers from
that, it does not write again. ``tests/test_direct_answers.py`` compares the
bytes with the handler's.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from twisted.internet import defer

from cache.collection_settings import OverCollectionLimit, StoredSettingsRefused
from cache.schema import DocumentInvalid
from cache.store import Document
from handlers.base import request_id_of
from handlers.direct_answer import (
    WRITE,
    DirectAnswer,
    DirectResponder,
    document_path,
    handed_over,
    head_end,
    head_start,
)
from handlers.http import validation
from handlers.http.errors import ApiError

_STATUS_LINES = {200: "HTTP/1.1 200 OK\r\n", 201: "HTTP/1.1 201 Created\r\n"}
# A write with any of these is the handler's: conditions it evaluates in Redis.
_CONDITIONS = ("If-Match", "If-None-Match", "If-Unmodified-Since")
# What a body the handler would refuse raises here: the handler says why.
_REFUSED = (ApiError, OverCollectionLimit, DocumentInvalid, StoredSettingsRefused)  # a schema's too


class DirectWrite(DirectResponder):
    """Answers the document replaces of one worker that need no Cyclone (the module's docstring says which)."""

    def __init__(self, responder: DirectResponder, max_body: int) -> None:
        super().__init__(**vars(responder))  # the same pieces as every direct responder
        self.max_body = max_body

    def answer(self, target: str, headers: Any, body: bytes) -> Optional[defer.Deferred]:
        """A Deferred of the answer to a ``PUT`` of ``target`` (it never fails), or None: take the full way."""
        names = document_path(target)
        if names is None:
            return None
        for condition in _CONDITIONS:
            if condition in headers:
                return None
        try:
            return self._write(names, headers, body)
        except _REFUSED:
            return None

    def _write(self, names: Tuple[str, str], headers: Any, body: bytes) -> Optional[defer.Deferred]:
        collection, doc_id = names
        # In the handler's order: authorization, the names and the body, the settings' rules.
        if not self.gate.admits_now(headers.get("Authorization"), collection, True):
            return None
        name, key = validation.collection_name(collection), validation.document_id(doc_id)
        value = validation.json_document(body, headers.get("Content-Type"), validation.JSON, self.max_body)
        rules = self.known_settings(collection)
        if rules is None:
            return None
        rules.check(value, len(body))
        written = self.store.put(name, key, body, ttl=rules.ttl_or_default(None), replicas=rules.write_replicas)
        return written.addBoth(self._written, headers)

    def _written(self, outcome: Any, headers: Any) -> DirectAnswer:
        """The store's outcome: the 201 or 200 of a write that was made, else the outcome for the handler."""
        if not isinstance(outcome, tuple):
            return handed_over(outcome, WRITE)  # a Failure
        document, created = outcome
        status = 201 if created else 200
        request_id = request_id_of(headers.get("X-Request-ID"), self.new_request_id)
        return DirectAnswer(
            self._head(status, document, request_id, headers) + document.body, status, request_id, outcome, WRITE
        )

    def _head(self, status: int, document: Document, request_id: str, headers: Any) -> bytes:
        """The head ``DocumentHandler`` writes for a write's answer: the validators, then the length."""
        parts = head_start(_STATUS_LINES[status], True, self.date(), request_id)
        parts += ("ETag: ", document.etag.decode(), "\r\nLast-Modified: ", document.last_modified.decode(), "\r\n")
        parts += ("Content-Length: ", str(len(document.body)), "\r\n")
        return head_end(parts, self.cors, headers)
