"""The JSON base handler: explicit content types and problem+json errors.

Every error, whether raised by a handler, by the store or by Cyclone itself
(unknown route, unsupported method), is rendered here and only here.
"""

from __future__ import annotations

import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs

import cyclone.web
from twisted.internet import defer

from cache.collection_settings import CollectionSettings
from cache.credentials.ratelimit import RateDecision
from cache.documents.idempotency import IdempotencyRecords, StoredResponse
from cache.documents.store import Document, DocumentStore
from cache.documents.variants import gzip_of
from cache.indexes import queries as index_queries
from cache.settings_cache import SettingsCache, settings_of
from handlers.framework import CycloneHandler
from handlers.http import validation
from handlers.http.auth import Gate, Grant
from handlers.http.cache_policy import ERROR_POLICY, policy_for
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError
from handlers.http.negotiation import IDENTITY, Negotiator, Preference
from handlers.http.problems import RETRY_AFTER_SECONDS, as_api_error, problem_reply, rate_limited, too_large
from handlers.http.reply import JSON_TYPE, PROBLEM_TYPE, REASONS, Reply, request_id_of
from handlers.http.representation import negotiate
from handlers.pipeline import both, query_argument

__all__ = ["JSON_TYPE", "PROBLEM_TYPE", "RETRY_AFTER_SECONDS", "as_api_error", "request_id_of", "too_large"]
ADMIN = "admin"
# What a list page can be sent as besides its bytes (made as it is sent, see send_composed).
_GZIP_ON_THE_FLY = (("gzip", b""),)


class JsonHandler(CycloneHandler):
    """Base of every handler: bytes out with an explicit type, errors as data."""

    SUPPORTED_METHODS: Tuple[str, ...] = ("GET", "HEAD", "OPTIONS")
    ROUTE = "unknown"  # the metrics label of the handler's route
    request_id = ""

    def set_default_headers(self) -> None:
        # Also runs when an error resets the headers, so errors carry the id
        # and the CORS headers too.
        if not self.request_id:
            self.request_id = request_id_of(self.request.headers.get("X-Request-ID"), self.application.new_request_id)
            tracing = self.application.tracing  # None: tracing off, and this check its only cost
            if tracing is not None:
                self.trace = begin_trace(tracing, self.request, self.ROUTE, self.request_id)
        self.set_default_header("X-Request-ID", self.request_id)
        if self.trace is not None:
            self.set_default_header("traceparent", self.trace.traceparent)
        cors = self.application.cors
        if cors.enabled:
            # Made once per origin, appended to the head as bytes (handlers/http/cors.py says why).
            self._cors_lines = cors.response_lines(self.request.headers.get("Origin"))

    def options(self, *path_args: str) -> None:
        """What the path supports; a browser's CORS preflight gets its answer here, before authorization."""
        self.set_header("Allow", ", ".join(self.SUPPORTED_METHODS))
        self.answer_preflight(self.SUPPORTED_METHODS)

    def is_preflight(self) -> bool:
        return self.request.method == "OPTIONS" and "Access-Control-Request-Method" in self.request.headers

    def answer_preflight(self, methods: Sequence[str]) -> None:
        """204, with the CORS preflight headers for ``methods`` when the request is a preflight."""
        if self.is_preflight():
            self.clear_cors_headers()
            origin = self.request.headers.get("Origin")
            for name, value in self.application.cors.preflight_headers(origin, methods):
                self.add_header(name, value)
        self.set_status(204)

    def clear_cors_headers(self) -> None:
        self._cors_lines = b""

    def send_bytes(self, status: int, body: bytes, content_type: str = JSON_TYPE) -> None:
        """Answer with ``body`` verbatim."""
        self.set_status(status)
        self.set_header("Content-Type", content_type)
        self.write(body)

    def send_document(self, status: int, document: Document) -> None:
        """Answer with a stored document and its validators."""
        self.set_validators(document)
        self.send_bytes(status, document.body)

    def set_validators(self, document: Document) -> None:
        self.set_header("ETag", document.etag)
        self.set_header("Last-Modified", document.last_modified)

    def send_no_content(self) -> None:
        self.set_status(204)

    def send_reply(self, reply: Reply) -> None:
        """Send a pipeline's reply (``handlers.pipeline``): the head the connection would write, through Cyclone."""
        self.set_reply_status(reply.status, REASONS[reply.status])
        self.reply = reply  # its head is the reply's own, with the trace's traceparent (handlers.framework)
        if reply.body and reply.status != 304:
            self.write(reply.body)

    def send_stored(self, response: StoredResponse) -> None:
        """Send a response made ahead (``cache.documents.idempotency``: perhaps the first attempt's, replayed)."""
        for name, value in response.headers:
            self.set_header(name, value)
        if response.status >= 400:
            self.set_header("Cache-Control", ERROR_POLICY)
        self.set_status(response.status)
        if response.body:
            self.write(response.body)

    def query_argument(self, name: str) -> Optional[str]:
        """A query parameter given at most once (blank counts as given)."""
        return query_argument(self.request.query, name)

    def query_arguments(self, name: str) -> List[str]:
        """Every value of a query parameter, in order (blank counts as given)."""
        return parse_qs(self.request.query, keep_blank_values=True).get(name, [])

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Cyclone's hook for an error's page: the problem's reply (``handlers.http.problems.problem_reply``)."""
        error = as_api_error(kwargs.get("exception")) or as_api_error(cyclone.web.HTTPError(status_code))
        allow = ", ".join(self.SUPPORTED_METHODS) if status_code == 405 else None
        self.send_reply(problem_reply(error, getattr(self, "rate_headers", ()), allow, self.trace))
        self.finish()


def begin_trace(tracing: Any, request: Any, route: str, request_id: str) -> Any:
    """A Cyclone request's span (``api.tracing.Tracing.begin``), named by its operation's path template when
    the connection routed it to one (``api.routed.Routed``), else by its handler's route label."""
    routed = getattr(request, "routed", None)
    operation = routed.operation if routed is not None else None
    template = operation.path if operation is not None else route
    return tracing.begin(request.method, template, request.path, request.headers, request_id, operation)


def document_response(status: int, document: Document, *headers: Tuple[str, str]) -> StoredResponse:
    """A write's answer as data: the document as stored, its validators, and ``headers``."""
    validators = (("ETag", document.etag.decode()), ("Last-Modified", document.last_modified.decode()))
    return StoredResponse(status, (("Content-Type", JSON_TYPE), *validators, *headers), document.body)


# Every method some path of the API answers: what a preflight to an unknown path is granted.
API_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class _AnyMethod(tuple):
    def __contains__(self, method: object) -> bool:
        return True


class NoRouteHandler(JsonHandler):
    """Cyclone's ``error_handler``: a 404 problem for any unknown path."""

    ROUTE = "none"
    # Any method on an unknown path is a 404, not a 405.
    SUPPORTED_METHODS = _AnyMethod()

    def initialize(self, status_code: int) -> None:
        self.set_status(status_code)

    def prepare(self) -> None:
        if not self.is_preflight():
            raise ApiError(404, "no-route", f"no resource at {self.request.path}")

    def options(self, *path_args: str) -> None:
        """A preflight (nothing else gets here): granted, so the request follows and its page reads the 404.

        Refused, the preflight would turn the 404 into an opaque network
        error (``TypeError: Failed to fetch``, seen in Chromium).
        """
        self.answer_preflight(API_METHODS)


def _plan(indexes: Any, filters: Dict[str, List[str]], limit: int, cursor: Optional[str], again: bool) -> Any:
    """``index_queries.plan``, its refusals as 400s; with ``again``, None when no index answers (to plan again)."""
    try:
        return index_queries.plan(indexes, filters, limit, cursor)
    except index_queries.NoIndex as error:
        if again:
            return None
        raise ApiError(400, "no-index", str(error)) from None
    except index_queries.QueryError as error:
        raise ApiError(400, "invalid-query", str(error)) from None


class ResourceHandler(JsonHandler):
    """A ``/v1`` handler: the request is authorized before its method runs."""

    def initialize(
        self,
        store: DocumentStore,
        max_body: int,
        gate: Gate,
        max_ids: int,
        cache_control: str,
        negotiator: Negotiator,
        compress_min_bytes: int,
        idempotency: IdempotencyRecords,
        collections: Optional[SettingsCache] = None,
    ) -> None:
        self.store = store
        self.max_body = max_body
        self.max_ids = max_ids
        self.gate = gate
        self.grant = Grant(None)
        self.cache_control = cache_control
        self.negotiator = negotiator
        self.compress_min_bytes = compress_min_bytes
        self.idempotency = idempotency
        self.collections = collections
        self.ticket_gate: Any = None  # the feed's (handlers.tickets.TicketGate): a ticket admits its own feed
        self.validated_with = b""  # what a composed page's ETag names beside its body (its count's Content-Range)

    def collection_settings(self, collection: bytes) -> defer.Deferred:
        """The collection's settings (``NO_SETTINGS`` when it has none): what a write must obey."""
        return defer.maybeDeferred(self.settings_now, collection)

    @defer.inlineCallbacks
    def planned_query(
        self, name: bytes, indexes: Any, filters: Dict[str, List[str]], limit: int, cursor: Optional[str] = None
    ) -> Any:
        """The query ``filters`` ask, planned onto the collection's ``indexes`` (``cache.indexes.queries``). When
        none answers it, onto the settings read again first: an index declared a moment ago through another
        worker may not have reached this worker's cache yet. Refused: 400 ``no-index`` or ``invalid-query``."""
        query = _plan(indexes, filters, limit, cursor, again=self.collections is not None)
        if query is not None:
            return query
        fresh = yield self.collections.fresh(name.decode())
        return _plan(fresh.indexes if fresh else (), filters, limit, cursor, again=False)

    def settings_now(self, collection: bytes) -> Any:
        """The collection's settings, now when this worker knows them, else a Deferred (``SettingsCache.resolve``)."""
        return settings_of(self.collections, collection.decode())

    def with_collection_policy(self, collection: bytes, reading: Any) -> Any:
        """``reading``'s result once the collection's cache policy replaces the default (read alongside it)."""
        return both(self.settings_now(collection), reading, self._use_policy)

    def _use_policy(self, settings: CollectionSettings, result: Any) -> Any:
        self.cache_control = policy_for(settings.cache_control, self.cache_control)
        return result

    def send_composed(self, body: bytes) -> None:
        """A list page or a multi-get (put together from stored bytes), gzipped as it is sent if the client prefers.

        Only bodies of at least ``compress_min_bytes``, as for documents: a
        page of small documents gzips cheaply beside its request, to a
        fraction of its size (docs/api.md, "HTTP caching and compression").
        """
        self.set_header("Cache-Control", self.cache_control)
        if self.request.method in ("GET", "HEAD") and self._not_modified_page(body):
            return
        if not self.compress_min_bytes:
            self.send_bytes(200, body)
            return
        self.add_header("Vary", "Accept-Encoding")
        coding = self._negotiate(_GZIP_ON_THE_FLY)
        if coding == IDENTITY or (len(body) < self.compress_min_bytes and IDENTITY in self._accepted()):
            self.send_bytes(200, body)
            return
        self.set_header("Content-Encoding", coding)
        self.send_bytes(200, gzip_of(body))

    def _not_modified_page(self, body: bytes) -> bool:
        """Give a page a weak ETag from its bytes; True (a 304 is set) when ``If-None-Match`` names it.

        Weak: it names the page's content whether it is sent gzipped or not.
        A CRC-32 and the length: several times cheaper than MD5 or SHA-1 on PyPy, and a page needs no more.
        """
        crc = zlib.crc32(body)
        if self.validated_with:  # a counted page: its count too (handlers.page_counts)
            crc = zlib.crc32(self.validated_with, crc)
        opaque = b'"%08x-%x"' % (crc, len(body))
        if_none_match = self.request.headers.get("If-None-Match")
        tags = validation.entity_tags(if_none_match, weak=True)
        if tags == b"*" or opaque in tags.split():
            if self.compress_min_bytes:
                self.add_header("Vary", "Accept-Encoding")
            self.send_not_modified(b"W/" + opaque)
            return True
        self.set_header("ETag", b"W/" + opaque)
        return False

    def _accepted(self) -> Preference:
        return self.negotiator.preference(self.request.headers.get("Accept-Encoding"))

    def _negotiate(self, encoded: Sequence[Tuple[str, bytes]]) -> str:
        return negotiate(self._accepted(), encoded)

    def send_not_modified(self, etag: bytes) -> None:
        self.set_header("ETag", etag)
        self.set_status(304)

    def prepare(self) -> Optional[defer.Deferred]:
        """The one admission of a handler's request, by the scope its operation declares (the table's).

        No declared operation for the method: admin scope (deny by default).
        A ``"token"`` operation (a batch) admits its token here; each of its
        own operations is then checked for its scope and collection.
        """
        if self.request.method == "OPTIONS":
            return None  # a CORS preflight carries no credentials
        operation = self.declared.get(self.request.method)
        scope = operation.scope if operation is not None else ADMIN
        if scope is None:
            return None
        authorization = self.request.headers.get("Authorization")
        if scope == "token":
            return self.gate.admit_batch(authorization, self.admission_cost()).addCallback(self._admitted)
        ticket = self.query_argument("ticket") if authorization is None and self.ticket_gate is not None else None
        if ticket is not None and operation is not None and "ticket" in operation.security:
            # A browser's EventSource cannot send Authorization: its ticket is its credential (handlers.tickets).
            return self.ticket_gate.admit(ticket, self.path_args[0]).addCallback(self._admitted)
        collection = self.path_args[0] if scope in ("read", "write") else "_collections"
        outcome = self.gate.grant_or_wait(authorization, collection, scope != "read", False)
        if is_deferred(outcome):
            return outcome.addCallback(self._admitted_as, scope)
        self._admitted_as(outcome, scope)  # the usual case: admitted at once, no Deferred
        return None

    def admission_cost(self) -> int:
        """What the request costs of its token's rate: one; a batch's, one per operation."""
        return 1

    def _admitted_as(self, grant: Grant, scope: str) -> None:
        self._admitted(grant)
        if scope == ADMIN and grant.record is not None and ADMIN not in grant.record.scopes:
            # A write:* token may not change the rules.
            raise ApiError(403, "forbidden", f"{self.request.method} {self.request.path} needs the admin scope")

    def _admitted(self, grant: Grant) -> None:
        self.grant = grant
        self.apply_rate(grant.rate)

    def apply_rate(self, rate: Optional[RateDecision]) -> None:
        if rate is None:
            return
        self.rate_headers = rate.headers()
        for name, value in self.rate_headers:
            self.set_header(name, value)
        if not rate.allowed:
            raise rate_limited(rate)
