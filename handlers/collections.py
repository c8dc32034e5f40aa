"""``/v1/{coll}``: create with a server-made id, list a page, get many.

List and multi-get bodies are put together from the stored bytes; no
document is parsed on the way out. Each has a byte budget
(``JETWAY_MAX_RESPONSE_BYTES``, ``cache.documents.bounded_reads``): a multi-get
past it is a 413 ``response-too-large`` before any body is read; a page
past it ends early, with its cursor, so any collection can be paged
through (no document is larger than the budget: ``api.config`` checks it
against ``JETWAY_MAX_BODY``). With ``Accept: application/x-ndjson`` the
list is the whole collection, streamed (``handlers.exports``).
"""

from __future__ import annotations

from typing import Any, Dict, List, NoReturn, Optional
from urllib.parse import parse_qs

from twisted.internet import defer
from twisted.logger import Logger

from cache.collection_settings import CollectionSettings
from cache.documents.store import Page
from cache.documents.write_plan import plan_write
from cache.errors import NotReplicated, PreconditionFailed
from cache.indexes import filters as index_filters
from cache.indexes import queries as index_queries
from cache.memory_return import MemoryReturn
from cache.ownership import OWNER_FIELD
from handlers import page_counts
from handlers.base import ResourceHandler, as_api_error, document_response
from handlers.exports import PAGE_DOCUMENTS, NdjsonExport, OwnedExport, wants_ndjson
from handlers.http import validation
from handlers.http.cache_policy import policy_for
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError, bad_request
from handlers.http.preferences import count_asked
from handlers.http.problems import RETRY_AFTER_SECONDS
from handlers.idempotency import respond_once
from handlers.ownership import bound_owner, owned_document, owned_reads
from handlers.paths import DOCUMENT

_log = Logger()
# The list's own query parameters (the operation table's ``listDocuments``): never a query's filters.
LIST_ARGUMENTS = frozenset({"limit", "cursor", "ids", "with_ids"})


def items_envelope(bodies: List[Optional[Any]], next_cursor: Optional[bytes], with_next: bool) -> bytes:
    """``{"items":[...]}`` (and ``"next"``) around stored bodies, unparsed, in one join (one copy of each)."""
    parts: List[Any] = [b'{"items":[']
    for body in bodies:
        parts += (b"null" if body is None else body, b",")
    if bodies:
        parts.pop()
    if not with_next:
        parts.append(b"]}")
    else:
        # A cursor is base64url, so it needs no JSON escaping.
        parts += (b'],"next":', b'"' + next_cursor + b'"' if next_cursor else b"null", b"}")
    return b"".join(parts)


class ComposedHandler(ResourceHandler):
    """A handler whose answers are composed from many stored documents: within a byte budget, and
    followed by ``cache.memory_return``'s pass when large (without it, a page of 16 documents of 1 MiB
    left a worker's memory high long after; docs/history/trust-record.md)."""

    def initialize(self, response_budget: int, memory: MemoryReturn, **documents: Any) -> None:
        super().initialize(**documents)
        self.response_budget = response_budget
        self.memory = memory

    def send_items(self, bodies: List[Optional[Any]], cursor: Optional[bytes] = None, with_next: bool = False) -> None:
        """A multi-get's answer (by GET or by POST: the same bytes) or a list page's."""
        body = items_envelope(bodies, cursor, with_next)
        self.send_composed(body)
        self.memory.after_answer(len(body))


class CollectionHandler(ComposedHandler):
    ROUTE = "collection"

    def get(self, collection: str) -> defer.Deferred:
        # Plain callbacks, as the document GET (handlers/documents.py).
        name = validation.collection_name(collection)
        settings = self.settings_now(name)
        if is_deferred(settings):
            return settings.addCallback(self._get, name)
        return self._get(settings, name)

    def _get(self, settings: CollectionSettings, name: bytes) -> defer.Deferred:
        ids = self.query_arguments("ids")
        arguments = parse_qs(self.request.query, keep_blank_values=True)
        filters = index_filters.filters_of(arguments, index_filters.field_names(settings.indexes), LIST_ARGUMENTS)
        owner = bound_owner(self.grant, settings)
        if owner is not None:
            if wants_ndjson(self.request.headers.get("Accept")) and not ids and not filters:
                return self._owned_export(name, settings, owner)
            if not ids:  # a page of the caller's documents is a query on the owner rule's index
                filters = {**filters, OWNER_FIELD: [*filters.get(OWNER_FIELD, ()), "eq." + owner]}
        # Prefer is read only when sent: a page that asks no count pays nothing for it.
        prefer = self.request.headers.get("Prefer")
        counting = count_asked(prefer) if prefer is not None else None
        if filters:
            if ids:
                raise bad_request("ids cannot be combined with a query's filters or order", "invalid-query")
            return self._query(name, filters, counting)
        if wants_ndjson(self.request.headers.get("Accept")) and not ids:
            return NdjsonExport(self, name).run()
        if ids:
            if self.query_argument("cursor") is not None:
                raise bad_request("ids cannot be combined with cursor", "invalid-ids")
            wanted = validation.id_list(ids, self.max_ids)
            validation.limit_beside_ids(self.query_argument("limit"), len(wanted))
            owned = None if owner is None else owned_reads(settings, owner)  # another's: as a missing one
            reading = self.store.get_many(name, wanted, self.response_budget, owned)
            return self.with_collection_policy(name, reading).addCallback(self._send_many)
        limit = validation.limit(self.query_argument("limit"))
        after = validation.decode_cursor(self.query_argument("cursor"))
        reading = self.store.page(name, limit, after, self.response_budget)
        if counting is not None:
            counted = self.store.count_of(name, None, after, counting == "exact")
            reading = page_counts.both(reading, counted).addCallback(self._counted)
        return self.with_collection_policy(name, reading).addCallback(self._send_page)

    @defer.inlineCallbacks
    def _query(self, name: bytes, filters: Dict[str, List[str]], counting: Optional[str] = None) -> Any:
        """A page of the documents a query over a declared index finds (``cache.indexes.queries``), and their
        count when ``Prefer`` asks one (``counting``: ``exact`` or ``estimated``)."""
        limit = validation.limit(self.query_argument("limit"))
        settings = yield self.collection_settings(name)
        self.cache_control = policy_for(settings.cache_control, self.cache_control)
        try:
            query = yield self.planned_query(name, settings.indexes, filters, limit, self.query_argument("cursor"))
            reading = self.store.query(name, query, self.response_budget)
            if counting is not None:
                counted = self.store.count_of(name, query, None, counting == "exact")
                reading = page_counts.both(reading, counted).addCallback(self._counted)
            found = yield reading
        except index_queries.IndexNotReady as error:
            self._index_building(name, query, error)
        cursor = validation.encode_cursor(found.last) if found.last is not None else None
        self.send_items(found.bodies, cursor, with_next=True)

    def _counted(self, read: List[Any]) -> Any:
        """A page (or a query's ``Found``) read beside its count: the count in its headers, the page given on."""
        page, count = read
        answered = page_counts.content_range(count, len(page.bodies))
        self.set_header("Content-Range", answered)
        # What was applied: exact, unless asked estimated or a mass expiry kept it from being exact (Count.exact).
        self.set_header("Preference-Applied", "count=exact" if count.exact else "count=estimated")
        self.add_header("Vary", "Prefer")
        self.validated_with = answered.encode()  # in the page's ETag: a 304 only when the count is the same too
        return page

    @defer.inlineCallbacks
    def _owned_export(self, name: bytes, settings: CollectionSettings, owner: str) -> Any:
        """A bound caller's NDJSON export: its documents, the owner rule's index paged through (``OwnedExport``)."""
        self.cache_control = policy_for(settings.cache_control, self.cache_control)
        query = yield self.planned_query(name, settings.indexes, {OWNER_FIELD: ["eq." + owner]}, PAGE_DOCUMENTS)
        try:
            yield OwnedExport(self, name, query).run()
        except index_queries.IndexNotReady as error:  # only the first page's read: the head is not sent yet
            self._index_building(name, query, error)

    def _index_building(self, name: bytes, query: index_queries.Query, error: Exception) -> NoReturn:
        """The 409 of a query on an index being built, its build resumed here if it stalled."""
        builds = self.store.index_builds
        if not builds.building(name, query.index) and builds.resume_due(name):
            self._resume_builds(name)
        raise ApiError(409, "index-building", str(error), {"Retry-After": RETRY_AFTER_SECONDS}) from None

    def _resume_builds(self, name: bytes) -> None:
        """The stored settings' indexes to every shard again, and their builds started (or resumed) here.

        Not waited for: the 409 goes now, and the build runs on in the background.
        """
        builds = self.store.index_builds
        reapplied = self.collections.store.reapply_indexes(name.decode())
        reapplied.addCallback(lambda indexes: builds.ensure(name, indexes))
        reapplied.addErrback(
            lambda failure: _log.warn(
                "indexes of {name} not reapplied: {error}", name=name.decode(), error=failure.getErrorMessage()
            )
        )

    def _send_many(self, bodies: List[Optional[bytes]]) -> None:
        self.send_items(bodies)

    def _send_page(self, page: Page) -> None:
        cursor = validation.encode_cursor(page.last_id) if page.last_id else None
        self.send_items(page.bodies, cursor, with_next=True)

    head = get

    def post(self, collection: str) -> defer.Deferred:
        name = validation.collection_name(collection)
        value = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, self.max_body
        )
        ttl = validation.ttl(self.query_argument("ttl"))
        # The id and ETag are chosen before anything is written: an
        # Idempotency-Key's retry writes with the same ones (handlers/idempotency.py).
        plan = self.store.new_id() + b" " + self.store.new_etag()
        return respond_once(self, plan, lambda plan: self._create(name, value, ttl, plan))

    @defer.inlineCallbacks
    def _create(self, name: bytes, value: Any, ttl: Optional[int], plan: bytes) -> Any:
        doc_id, etag = plan.split(b" ")
        location = ("Location", DOCUMENT.format(collection=name.decode(), id=doc_id.decode()))
        # Checked inside the Idempotency-Key's claim: a schema violation (422)
        # is this request's answer, recorded and replayed like the others.
        rules = yield self.collection_settings(name)
        body = self.request.body
        owner = bound_owner(self.grant, rules)
        if owner is not None:  # created as its writer's: the owner member filled in or checked
            value, body = owned_document(rules.owner, owner, value, body)  # type: ignore[arg-type]
        plan = plan_write(rules, value, len(body), doc_id, ttl)  # before anything is stored
        try:
            _, document = yield self.store.create(name, body, plan, doc_id, etag)
        except NotReplicated as error:
            # Stored on the primary under an id the client has not seen: say where.
            problem = as_api_error(error)
            assert problem is not None
            problem.headers["Location"] = location[1]
            raise problem from None
        except PreconditionFailed:
            # Only a retry of a plan gets here: the first attempt created the
            # document, and it has been written again since. It was created.
            document = yield self.store.get(name, doc_id)
            if document is None:
                raise
        return document_response(201, document, location)
