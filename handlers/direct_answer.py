"""What the direct read and the direct write share: the answer's shape, the path, the head's frame.

Both answer a request on the connection, before any Cyclone object is
made (``handlers.direct_read``, ``handlers.direct_write``), with the bytes
the handler would write. Cyclone writes a head in the order its headers
were first set: the handler's defaults (``JsonHandler.clear``: ``Server``,
``Content-Type``, ``Date``, ``X-Request-ID``), then what the method set,
``Content-Length`` last, then list headers (``Vary``), then the CORS lines.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from twisted.internet import defer
from twisted.python.failure import Failure

from cache.collection_settings import NO_SETTINGS, CollectionSettings
from cache.settings_cache import SettingsCache
from cache.store import DocumentStore
from handlers.base import JSON_TYPE, SERVER
from handlers.http.auth import Gate
from handlers.http.cors import CorsPolicy

_PREFIX = "/v1/"
# What the metrics count a direct answer as (``jetway_direct_answers_total``'s kind).
HOT_READ, REDIS_READ, WRITE = "hot_read", "redis_read", "write"


class DirectAnswer:
    """A direct answer: its whole response, or (``response`` None) what the handler answers from.

    ``outcome`` is what the store gave (a read's ``Document`` or None, a
    write's ``(Document, created)``, or a ``Failure``); ``kind`` is what the
    metrics count. The handler is handed the outcome of a read not found,
    of a coding the client refuses, of any failure, and of anything the
    connection could not answer itself (it began closing meanwhile).
    """

    __slots__ = ("kind", "outcome", "request_id", "response", "status")

    def __init__(self, response: Optional[bytes], status: int, request_id: str, outcome: Any, kind: str) -> None:
        self.response = response
        self.status = status
        self.request_id = request_id
        self.outcome = outcome
        self.kind = kind

    def fired(self) -> Any:
        """The outcome as the store gave it: a failed Deferred for a ``Failure``, else the value."""
        return defer.fail(self.outcome) if isinstance(self.outcome, Failure) else self.outcome


class DirectResponder:
    """What the direct read and write both answer with: the handler's pieces, shared with it."""

    def __init__(
        self,
        store: DocumentStore,
        gate: Gate,
        collections: Optional[SettingsCache],
        cors: CorsPolicy,
        date: Callable[[], str],
        new_request_id: Callable[[], str],
    ) -> None:
        self.store = store
        self.gate = gate
        self.collections = collections
        self.cors = cors
        self.date = date
        self.new_request_id = new_request_id

    def known_settings(self, collection: str) -> Optional[CollectionSettings]:
        """The collection's settings if this worker knows them now (``NO_SETTINGS`` without the cache); else None.

        ``ResourceHandler.known_collection_settings``, for a request that has no handler.
        """
        if self.collections is None:
            return NO_SETTINGS
        return self.collections.peek(collection)


def handed_over(outcome: Any, kind: str) -> DirectAnswer:
    """An outcome for the handler to answer: not a 200 or 304 (or a write's 201), or a failure."""
    return DirectAnswer(None, 0, "", outcome, kind)


def document_path(target: str) -> Optional[Tuple[str, str]]:
    """``/v1/{collection}/{id}`` as its two names, or None: another path, or one Cyclone would change.

    Cyclone would unescape the path, and a query is the handler's to read
    (or to ignore).
    """
    if not target.startswith(_PREFIX) or "%" in target or "?" in target:
        return None
    collection, slash, doc_id = target[len(_PREFIX) :].partition("/")
    if not slash or "/" in doc_id:
        return None
    return collection, doc_id


def head_start(status_line: str, typed: bool, date: str, request_id: str) -> List[str]:
    """The head's parts up to the handler's defaults: status, ``Server``, ``Content-Type``, ``Date``, the id."""
    parts = [status_line, "Server: ", SERVER, "\r\n"]
    if typed:
        parts += ("Content-Type: ", JSON_TYPE, "\r\n")
    parts += ("Date: ", date, "\r\nX-Request-ID: ", request_id, "\r\n")
    return parts


def head_end(parts: List[str], cors: CorsPolicy, headers: Any) -> bytes:
    """The head from its parts, with the CORS lines for the request's ``Origin`` and the blank line."""
    head = "".join(parts).encode()
    if cors.enabled:
        head += cors.response_lines(headers.get("Origin"))
    return head + b"\r\n"
