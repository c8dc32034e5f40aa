"""The direct read: a document read answered before any Cyclone object is made.

A document read through Cyclone makes an ``HTTPRequest``, a handler (its
headers dictionary, ``clear``, ``initialize``, ``prepare``), and finishes
through ``finish``, ``flush``, the request's and the connection's
``finish`` and the log function: most of a worker's own CPU on a read
(README, "The read path"). ``DirectRead.answer`` takes such a read from the
connection and answers it with the same pieces the handler uses (the gate,
the collection's known settings, the store and its hot cache,
``handlers.representation``, the CORS lines):

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
(``DirectAnswer.read``), not made again. ``tests/test_direct_read.py``
compares the bytes with the handler's for every kind of request this takes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from twisted.internet import defer

from cache.collection_settings import NO_SETTINGS, CollectionSettings
from cache.settings_cache import SettingsCache
from cache.store import Document, DocumentStore
from handlers import validation
from handlers.auth import Gate
from handlers.base import JSON_TYPE, SERVER, request_id_of
from handlers.cors import CorsPolicy
from handlers.deferreds import is_deferred
from handlers.documents import DocumentHandler
from handlers.errors import ApiError
from handlers.negotiation import IDENTITY, Negotiator
from handlers.representation import Representation, represent

ROUTE = DocumentHandler.ROUTE
_PREFIX = "/v1/"
_STATUS_LINES = {200: "HTTP/1.1 200 OK\r\n", 304: "HTTP/1.1 304 Not Modified\r\n"}


class DirectAnswer:
    """A direct read's outcome: its whole response, or (``response`` None) the read for the handler to answer.

    ``read`` is what the store gave (a ``Document``, None when there is
    none, or a ``Failure``); ``hot``: the hot cache held the document.
    """

    __slots__ = ("hot", "read", "request_id", "response", "status")

    def __init__(self, response: Optional[bytes], status: int, request_id: str, read: Any, hot: bool) -> None:
        self.response = response
        self.status = status
        self.request_id = request_id
        self.read = read
        self.hot = hot


class DirectRead:
    """Answers the document reads of one worker that need no Cyclone (the module's docstring says which)."""

    def __init__(
        self,
        store: DocumentStore,
        gate: Gate,
        collections: Optional[SettingsCache],
        cache_control: str,
        negotiator: Negotiator,
        cors: CorsPolicy,
        date: Callable[[], str],
        new_request_id: Callable[[], str],
    ) -> None:
        self.store = store
        self.gate = gate
        self.collections = collections
        self.cache_control = cache_control
        self.negotiator = negotiator
        self.cors = cors
        self.date = date
        self.new_request_id = new_request_id

    def answer(self, method: str, target: str, headers: Any) -> Union[None, DirectAnswer, defer.Deferred]:
        """The answer to a ``GET`` or ``HEAD`` of ``target`` with ``headers``: now, or a Deferred of it
        (while Redis is asked; it never fails); None: take the full way."""
        if (method != "GET" and method != "HEAD") or not target.startswith(_PREFIX):
            return None
        collection, slash, doc_id = target[len(_PREFIX) :].partition("/")
        # Cyclone would unescape the path, and a query is the handler's to ignore.
        if not slash or "/" in doc_id or "%" in target or "?" in target:
            return None
        try:
            return self._answer(method, collection, doc_id, headers)
        except ApiError:
            return None  # a bad name or id, or a coding refused: the handler says why

    def _answer(
        self, method: str, collection: str, doc_id: str, headers: Any
    ) -> Union[None, DirectAnswer, defer.Deferred]:
        # In the handler's order: authorization, the settings, the document.
        if not self.gate.admits_read_now(headers.get("Authorization"), collection):
            return None
        settings = self._known_settings(collection)
        if settings is None:
            return None
        fresh = validation.wants_fresh(headers.get("Cache-Control"))
        # A key the hot cache holds was made from names already checked (the request line is ASCII).
        name, key = collection.encode(), doc_id.encode()
        document = None if fresh else self.store.hot_hit(name, key)
        if document is not None:
            return self._answered(method, document, settings, headers, True)
        validation.collection_name(collection)  # what goes to Redis is checked first, as the handler does
        validation.document_id(doc_id)
        found = self.store.get_or_wait(name, key, fresh)
        if not is_deferred(found):
            return self._answered(method, found, settings, headers, True)
        return found.addBoth(self._read, method, settings, headers)

    def _read(self, found: Any, method: str, settings: CollectionSettings, headers: Any) -> DirectAnswer:
        """Redis's answer: the response when it is a 200 or a 304, else the read for the handler."""
        if isinstance(found, Document):
            try:
                return self._answered(method, found, settings, headers, False)
            except ApiError:
                pass  # a coding refused: the handler's 406
        return DirectAnswer(None, 0, "", found, False)

    def _answered(
        self, method: str, document: Document, settings: CollectionSettings, headers: Any, hot: bool
    ) -> DirectAnswer:
        chosen = represent(document, headers, self.negotiator.preference(headers.get("Accept-Encoding")))
        cache_control = self.cache_control if settings.cache_control is None else settings.cache_control
        request_id = request_id_of(headers.get("X-Request-ID"), self.new_request_id)
        head = self._head(chosen, document.last_modified, cache_control, request_id, headers.get("Origin"))
        body = chosen.body if method == "GET" else b""
        return DirectAnswer(head + body, chosen.status, request_id, document, hot)

    def _known_settings(self, collection: str) -> Optional[CollectionSettings]:
        if self.collections is None:
            return NO_SETTINGS
        return self.collections.peek(collection)

    def _head(
        self, chosen: Representation, last_modified: bytes, cache_control: str, request_id: str, origin: Optional[str]
    ) -> bytes:
        """The head ``DocumentHandler`` writes for ``chosen``, header for header in its order.

        That is Cyclone's: the handler's defaults (``JsonHandler.clear``), the
        headers the read sets, ``Content-Length`` last; ``Vary`` after them
        (added as a list header), the CORS lines after that. A 304 has no
        ``Content-Type``, ``Last-Modified`` nor ``Content-Length``.
        """
        modified = chosen.status == 200
        parts = [_STATUS_LINES[chosen.status], "Server: ", SERVER, "\r\n"]
        if modified:
            parts += ("Content-Type: ", JSON_TYPE, "\r\n")
        parts += ("Date: ", self.date(), "\r\nX-Request-ID: ", request_id, "\r\nCache-Control: ", cache_control)
        parts += ("\r\nETag: ", chosen.etag.decode(), "\r\n")
        if modified:
            parts += ("Last-Modified: ", last_modified.decode(), "\r\n")
            if chosen.coding != IDENTITY:
                parts += ("Content-Encoding: ", chosen.coding, "\r\n")
            parts += ("Content-Length: ", str(len(chosen.body)), "\r\n")
        if chosen.vary:
            parts.append("Vary: Accept-Encoding\r\n")
        head = "".join(parts).encode()
        if self.cors.enabled:
            head += self.cors.response_lines(origin)
        return head + b"\r\n"
