"""The direct read: a document read answered before any Cyclone object is made.

A document read through Cyclone makes an ``HTTPRequest``, a handler (its
headers dictionary, ``clear``, ``initialize``, ``prepare``), and finishes
through ``finish``, ``flush``, the request's and the connection's
``finish`` and the log function: most of a worker's own CPU on a read
(docs/performance.md, "The read path"). ``DirectRead.answer`` takes such a read from the
connection and answers it with the same pieces the handler uses (the gate,
the collection's known settings, the store and its hot cache,
``handlers.http.representation``, the CORS lines):

- a document the hot cache holds (a *hot read*) is answered at once;
- any other is read from Redis as the handler would (``get_or_wait``: one
  HMGET, filling the hot cache), and answered when the reply comes.

It takes a read only when every step but the document can be decided at
once: ``GET`` or ``HEAD`` of ``/v1/{collection}/{id}`` with no query and no
escaped character, a token this worker already knows valid with read
scope and no rate, the collection's settings known. Anything else goes the
full way through ``DocumentHandler``. So does every answer but a 200 or a
304: a document not found, a Redis error and a coding the client refuses
are the handler's to answer, and a read already made is handed to it
(``DirectAnswer.outcome``), not made again. ``tests/test_direct_answers.py``
compares the bytes with the handler's for every kind of request this takes.
"""

from __future__ import annotations

from typing import Any, Union

from twisted.internet import defer

from cache.collection_settings import CollectionSettings
from cache.store import Document
from handlers.base import request_id_of
from handlers.direct_answer import (
    HOT_READ,
    REDIS_READ,
    DirectAnswer,
    DirectResponder,
    document_path,
    handed_over,
    head_end,
    head_start,
)
from handlers.documents import DocumentHandler
from handlers.http import validation
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError
from handlers.http.negotiation import IDENTITY, Negotiator
from handlers.http.representation import Representation, represent

ROUTE = DocumentHandler.ROUTE
_STATUS_LINES = {200: "HTTP/1.1 200 OK\r\n", 304: "HTTP/1.1 304 Not Modified\r\n"}


class DirectRead(DirectResponder):
    """Answers the document reads of one worker that need no Cyclone (the module's docstring says which)."""

    def __init__(self, responder: DirectResponder, cache_control: str, negotiator: Negotiator) -> None:
        super().__init__(**vars(responder))  # the same pieces as every direct responder
        self.cache_control = cache_control
        self.negotiator = negotiator

    def answer(self, method: str, target: str, headers: Any) -> Union[None, DirectAnswer, defer.Deferred]:
        """The answer to a ``GET`` or ``HEAD`` of ``target`` with ``headers``: now, or a Deferred of it
        (while Redis is asked; it never fails); None: take the full way."""
        names = document_path(target) if method == "GET" or method == "HEAD" else None
        if names is None:
            return None
        try:
            return self._answer(method, names[0], names[1], headers)
        except ApiError:
            return None  # a bad name or id, or a coding refused: the handler says why

    def _answer(
        self, method: str, collection: str, doc_id: str, headers: Any
    ) -> Union[None, DirectAnswer, defer.Deferred]:
        # In the handler's order: authorization, the settings, the document.
        if not self.gate.admits_now(headers.get("Authorization"), collection, False):
            return None
        settings = self.known_settings(collection)
        if settings is None:
            return None
        fresh = validation.wants_fresh(headers.get("Cache-Control"))
        # A key the hot cache holds was made from names already checked (the request line is ASCII).
        name, key = collection.encode(), doc_id.encode()
        document = None if fresh else self.store.hot_hit(name, key)
        if document is not None:
            return self._answered(method, document, settings, headers, HOT_READ)
        validation.collection_name(collection)  # what goes to Redis is checked first, as the handler does
        validation.document_id(doc_id)
        found = self.store.get_or_wait(name, key, fresh)
        if not is_deferred(found):
            return self._answered(method, found, settings, headers, HOT_READ)
        return found.addBoth(self._read, method, settings, headers)

    def _read(self, found: Any, method: str, settings: CollectionSettings, headers: Any) -> DirectAnswer:
        """Redis's answer: the response when it is a 200 or a 304, else the read for the handler."""
        if isinstance(found, Document):
            try:
                return self._answered(method, found, settings, headers, REDIS_READ)
            except ApiError:
                pass  # a coding refused: the handler's 406
        return handed_over(found, REDIS_READ)

    def _answered(
        self, method: str, document: Document, settings: CollectionSettings, headers: Any, kind: str
    ) -> DirectAnswer:
        chosen = represent(document, headers, self.negotiator.preference(headers.get("Accept-Encoding")))
        cache_control = self.cache_control if settings.cache_control is None else settings.cache_control
        request_id = request_id_of(headers.get("X-Request-ID"), self.new_request_id)
        head = self._head(chosen, document.last_modified, cache_control, request_id, headers)
        body = chosen.body if method == "GET" else b""
        return DirectAnswer(head + body, chosen.status, request_id, document, kind)

    def _head(
        self, chosen: Representation, last_modified: bytes, cache_control: str, request_id: str, headers: Any
    ) -> bytes:
        """The head ``DocumentHandler`` writes for ``chosen``, header for header in its order.

        The read sets ``Cache-Control`` and the validators; a 304 has no
        ``Content-Type``, ``Last-Modified`` nor ``Content-Length``.
        """
        modified = chosen.status == 200
        parts = head_start(_STATUS_LINES[chosen.status], modified, self.date(), request_id)
        parts += ("Cache-Control: ", cache_control, "\r\nETag: ", chosen.etag.decode(), "\r\n")
        if modified:
            parts += ("Last-Modified: ", last_modified.decode(), "\r\n")
            if chosen.coding != IDENTITY:
                parts += ("Content-Encoding: ", chosen.coding, "\r\n")
            parts += ("Content-Length: ", str(len(chosen.body)), "\r\n")
        if chosen.vary:
            parts.append("Vary: Accept-Encoding\r\n")
        return head_end(parts, self.cors, headers)
