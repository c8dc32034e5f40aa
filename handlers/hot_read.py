"""The hot read: a document read answered from the hot cache before any Cyclone object is made.

A hot document read through Cyclone makes an ``HTTPRequest``, a handler
(its headers dictionary, ``clear``, ``initialize``, ``prepare``), and
finishes through ``finish``, ``flush``, the request's and the connection's
``finish`` and the log function: most of a worker's own CPU on a read that
touches no Redis (README, "The read path"). ``HotRead.answer`` gives such a
read its response bytes directly, from the same pieces the handler uses
(the gate, the collection's known settings, the hot cache,
``handlers.representation``, the CORS lines), or None.

None whenever any step cannot be decided now or is not a success: another
method or path, a query string or an escaped character in the path, a
token not yet known valid or with a rate, unknown collection settings, a
document not in the hot cache, a request for a fresh copy, a coding the
client refuses. The request then goes the full way through
``DocumentHandler``, which also answers every error. So a hot read answers
only a 200 or a 304, over keep-alive HTTP/1.1, with the same bytes as the
handler would (``tests/test_hot_read.py`` compares the two for every kind
of request this takes).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from cache.collection_settings import NO_SETTINGS, CollectionSettings
from cache.settings_cache import SettingsCache
from cache.store import DocumentStore
from handlers import validation
from handlers.auth import Gate
from handlers.base import JSON_TYPE, SERVER, request_id_of
from handlers.cors import CorsPolicy
from handlers.documents import DocumentHandler
from handlers.errors import ApiError
from handlers.negotiation import IDENTITY, Negotiator
from handlers.representation import Representation, represent

ROUTE = DocumentHandler.ROUTE
_PREFIX = "/v1/"
_STATUS_LINES = {200: "HTTP/1.1 200 OK\r\n", 304: "HTTP/1.1 304 Not Modified\r\n"}


class HotAnswer:
    """A hot read's whole response, and what its access line and metrics need."""

    __slots__ = ("request_id", "response", "status")

    def __init__(self, response: bytes, status: int, request_id: str) -> None:
        self.response = response
        self.status = status
        self.request_id = request_id


class HotRead:
    """Answers hot document reads of one worker (see the module's docstring for which)."""

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

    def answer(self, method: str, target: str, headers: Any) -> Optional[HotAnswer]:
        """The response to a ``GET`` or ``HEAD`` of ``target`` with ``headers``, or None: take the full way."""
        if (method != "GET" and method != "HEAD") or not target.startswith(_PREFIX):
            return None
        collection, slash, doc_id = target[len(_PREFIX) :].partition("/")
        # Cyclone would unescape the path, and a query is the handler's to ignore.
        if not slash or "/" in doc_id or "%" in target or "?" in target:
            return None
        try:
            return self._answer(method, collection, doc_id, headers)
        except ApiError:
            return None  # a coding refused: the handler says why

    def _answer(self, method: str, collection: str, doc_id: str, headers: Any) -> Optional[HotAnswer]:
        # Whether the document is held first: a miss (the hot cache's miss
        # path, README "The hot cache") pays two encodes and a dictionary
        # lookup here, not the gate and the names' patterns as well. A held
        # key was made from names already checked; the request line is ASCII.
        name, key = collection.encode(), doc_id.encode()
        if not self.store.holds_hot(name, key):
            return None
        if not self.gate.admits_read_now(headers.get("Authorization"), collection):
            return None
        settings = self._known_settings(collection)
        if settings is None or validation.wants_fresh(headers.get("Cache-Control")):
            return None
        document = self.store.hot_hit(name, key)
        if document is None:
            return None
        chosen = represent(document, headers, self.negotiator.preference(headers.get("Accept-Encoding")))
        cache_control = self.cache_control if settings.cache_control is None else settings.cache_control
        request_id = request_id_of(headers.get("X-Request-ID"), self.new_request_id)
        head = self._head(chosen, document.last_modified, cache_control, request_id, headers.get("Origin"))
        body = chosen.body if method == "GET" else b""
        return HotAnswer(head + body, chosen.status, request_id)

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
