"""The pipelines of a document's read (``GET``, ``HEAD``) and replace (``PUT``): the hottest operations.

Each is a few steps (``handlers.pipeline``), in this order:

- read: admit the token (its rate step, if it has one, rides with the
  read), check the names, then read the document (the hot cache, else one
  HMGET) alongside the collection's settings (its cache policy), and
  represent it (the coding the client accepts, or a 304);
- replace: admit the token (and take its rate step), check the names, the
  body (media type, size, strict JSON, an object) and ``?ttl``, then the
  collection's rules (limits, schema), then write it with the request's
  conditions and the collection's TTL and write concern.

The connection runs them for a request on a keep-alive connection; the
document route's handler runs the very same for any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from twisted.internet import defer

from cache.collection_settings import CollectionSettings
from cache.documents.store import NO_CONDITIONS, Conditions, Document, DocumentStore
from cache.documents.variants import base_tag
from cache.documents.write_plan import plan_write
from cache.settings_cache import SettingsCache, settings_of
from handlers.http import conditional, validation
from handlers.http.auth import RATE_SCRIPTS, Gate, Grant
from handlers.http.cache_policy import policy_for
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError, not_found
from handlers.http.negotiation import IDENTITY, Negotiator
from handlers.http.reply import JSON_TYPE, Headers, Reply
from handlers.http.representation import represent
from handlers.ownership import bound_owner, owned_document, pinned, visible_document
from handlers.pipeline import Exchange, Step, both, then

# What the metrics count a reply the connection sent as (``jetway_direct_answers_total``'s kind).
HOT_READ, REDIS_READ, WRITE = "hot_read", "redis_read", "write"


@dataclass(eq=False)
class DocumentAnswers:
    """The read and replace pipelines of one worker, with what they use."""

    store: DocumentStore
    gate: Gate
    collections: Optional[SettingsCache]
    negotiator: Negotiator
    cache_control: str  # the server's default policy (JETWAY_CACHE_CONTROL)
    max_body: int

    def settings(self, collection: str) -> Any:
        """The collection's settings, now or a Deferred (``SettingsCache.resolve``)."""
        return settings_of(self.collections, collection)

    # The read.

    def read(self, exchange: Exchange) -> Step:
        authorization = exchange.headers.get("Authorization")
        # The scope the table declares; the rate step rides with the read.
        granted = self.gate.grant_or_wait(authorization, exchange.args[0], exchange.scope != "read", True)
        if is_deferred(granted):
            return granted.addCallback(self._read_admitted, exchange)
        return self._read_admitted(granted, exchange)  # the usual token, known: no Deferred

    def _read_admitted(self, grant: Grant, exchange: Exchange) -> Step:
        exchange.admit(grant)
        collection, doc_id = exchange.args
        name, key = validation.collection_name(collection), validation.document_id(doc_id)
        fresh = validation.wants_fresh(exchange.headers.get("Cache-Control"))
        if grant.pending_rate is None:
            found = self.store.get_or_wait(name, key, fresh)
        else:
            along = self.store.get_along(name, key, grant.pending_rate, RATE_SCRIPTS, fresh)
            found = along.addCallback(_settled, grant, exchange)
        settings = self.settings(collection)
        if is_deferred(settings):  # the collection's first read on this worker: read alongside the document
            return both(settings, found, self._represent, exchange, REDIS_READ if is_deferred(found) else HOT_READ)
        if is_deferred(found):
            return found.addCallback(self._found, settings, exchange)
        return self._represent(settings, found, exchange, HOT_READ)  # a hot read: no Deferred at all

    def _found(self, document: Optional[Document], settings: CollectionSettings, exchange: Exchange) -> Reply:
        return self._represent(settings, document, exchange, REDIS_READ)

    def _represent(
        self, settings: CollectionSettings, document: Optional[Document], exchange: Exchange, kind: str
    ) -> Reply:
        """The 200 (the coding the client accepts best) or the 304; a 404 when there is no document, or
        when the collection's owner rule hides it from the caller (answered exactly as a missing one)."""
        if document is None:
            raise not_found()
        if settings.owner is not None:
            owner = bound_owner(exchange.grant, settings)
            if owner is not None and not visible_document(settings.owner, owner, document):
                raise not_found()
        headers = exchange.headers
        chosen = represent(document, headers, self.negotiator.preference(headers.get("Accept-Encoding")))
        lines: Headers = [
            *exchange.rate_headers,
            ("Cache-Control", policy_for(settings.cache_control, self.cache_control)),
        ]
        lines.append(("ETag", chosen.etag.decode()))
        if chosen.status == 304:
            return Reply(304, None, lines, b"", chosen.vary, kind)
        lines.append(("Last-Modified", document.last_modified.decode()))
        if chosen.coding != IDENTITY:
            lines.append(("Content-Encoding", chosen.coding))
        return Reply(200, JSON_TYPE, lines, chosen.body, chosen.vary, kind)

    # The replace.

    def replace(self, exchange: Exchange) -> Step:
        authorization = exchange.headers.get("Authorization")
        granted = self.gate.grant_or_wait(authorization, exchange.args[0], exchange.scope != "read", False)
        return then(granted, self._replace_admitted, exchange)

    def _replace_admitted(self, grant: Grant, exchange: Exchange) -> Step:
        exchange.admit(grant)
        collection, doc_id = exchange.args
        keys = validation.collection_name(collection), validation.document_id(doc_id)
        headers = exchange.headers
        value = validation.json_document(exchange.body, headers.get("Content-Type"), validation.JSON, self.max_body)
        ttl = validation.ttl(exchange.query_argument("ttl"))
        settings = self.settings(collection)
        if is_deferred(settings):
            return settings.addCallback(self._replace_checked, exchange, keys, value, ttl)
        return self._replace_checked(settings, exchange, keys, value, ttl)  # the usual case: known

    def _replace_checked(
        self, rules: CollectionSettings, exchange: Exchange, keys: Tuple[bytes, bytes], value: Any, ttl: Optional[int]
    ) -> Step:
        body = exchange.body
        if rules.owner is not None:
            owner = bound_owner(exchange.grant, rules)
            if owner is not None:
                return self._replace_owned(rules, exchange, keys, value, ttl, owner)
        plan = plan_write(rules, value, len(body), keys[1], ttl)  # before anything is stored
        written = self.store.put(*keys, body, write_conditions(exchange.headers), plan)
        return written.addCallback(_written, exchange)

    @defer.inlineCallbacks
    def _replace_owned(
        self,
        rules: CollectionSettings,
        exchange: Exchange,
        keys: Tuple[bytes, bytes],
        value: Any,
        ttl: Optional[int],
        owner: str,
    ) -> Any:
        """A replace by a caller the owner rule binds: as its owner, of its own document (or a new one), pinned."""
        value, body = owned_document(rules.owner, owner, value, exchange.body)  # type: ignore[arg-type]
        plan = plan_write(rules, value, len(body), keys[1], ttl)
        current = yield self.store.get(*keys, fresh=True)
        if current is not None and not visible_document(rules.owner, owner, current):  # type: ignore[arg-type]
            raise ApiError(403, "forbidden", "this document belongs to another owner")
        written = yield self.store.put(*keys, body, pinned(write_conditions(exchange.headers), current), plan)
        return _written(written, exchange)


def _settled(reply: Tuple[Any, Optional[Document]], grant: Grant, exchange: Exchange) -> Optional[Document]:
    """The document read along with the token's rate step, once the step's decision is taken."""
    rate, document = reply
    exchange.apply_rate(grant.settle(rate))
    return document


def _written(outcome: Tuple[Document, bool], exchange: Exchange) -> Reply:
    document, created = outcome
    lines = [
        *exchange.rate_headers,
        ("ETag", document.etag.decode()),
        ("Last-Modified", document.last_modified.decode()),
    ]
    return Reply(201 if created else 200, JSON_TYPE, lines, document.body, False, WRITE)


def write_conditions(headers: Any) -> Conditions:
    """A write's preconditions: ``If-Match``, ``If-None-Match`` (weak) and ``If-Unmodified-Since``."""
    if "If-Match" not in headers and "If-None-Match" not in headers and "If-Unmodified-Since" not in headers:
        return NO_CONDITIONS  # the plain replace
    return Conditions(
        if_match(headers), validation.entity_tags(headers.get("If-None-Match"), weak=True), if_unmodified_since(headers)
    )


def if_match(headers: Any) -> bytes:
    """The ``If-Match`` tags, each a variant's named by its document's own tag.

    A client that read a compressed variant holds that variant's tag; it
    names the same document.
    """
    tags = validation.entity_tags(headers.get("If-Match"), weak=False)
    return tags if tags in (b"", b"*") else b" ".join(base_tag(tag) for tag in tags.split())


def if_unmodified_since(headers: Any) -> Optional[int]:
    return conditional.http_date(headers.get("If-Unmodified-Since"))
