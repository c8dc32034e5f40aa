"""``GET /v1/{coll}`` as NDJSON (``Accept: application/x-ndjson``): every document, streamed in id order.

Each line is a document's stored bytes, verbatim, or with ``?with_ids=1``
``{"id":"<id>","doc":<stored bytes>}`` (what ``python -m api export``
writes, and what ``POST /v1/_import/{coll}?with_ids=1`` reads back: an id
needs no escaping, so the document's bytes sit in the line as stored).
``?cursor=`` starts after an id, as a list page's ``next`` does. The head
says how many documents the collection holds (``X-Jetway-Documents``).

The collection is read a page at a time (``DocumentStore.scan``, a
``cache.documents.scan.CollectionScan``: at most ``PAGE_DOCUMENTS``
documents, fewer when the pages read so far say that ``PAGE_BYTES`` ends a
page sooner, or one document larger than that); each page is written as
one HTTP/1.1 chunk (to HTTP/1.0, the body ends with the connection). The
next page is asked of Redis before this one is made into lines, and sent to
Redis at once (``cache.redis.resp.sent_at_once``); the scan knows its ids
already, so Redis reads its bodies while the worker writes. The one after
it is asked only once the transport has sent this one (``when_drained`` on
the connection, ``api.streamed_body``): a worker holds about two pages per
export however slowly its client reads, and a client that stops reading
for the send timeout is cut off. A body cut short (the token revoked
meanwhile, Redis failing) ends without its last chunk and closes the
connection, so a client can tell it from a whole one; it resumes from the
last id it has.

A caller bound by the collection's owner rule (``handlers.ownership``)
exports its own documents only (``OwnedExport``): the pages are a query
``_owner=eq.<owner>`` on the rule's index, paged through as its list pages
are (never a scan of everyone's, filtered), still in id order (an entry is
the owner's bytes, then the id), and its head tells no count (the
collection's is not the caller's to know).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from cache.documents.scan import CollectionScan
from cache.documents.store import Page
from cache.indexes.queries import Query
from cache.indexes.reads import Found
from cache.redis.resp import sent_at_once
from handlers.http import validation
from handlers.http.auth import unauthorized
from handlers.http.problems import problem_of
from handlers.imports import NDJSON, with_ids_flag
from handlers.pipeline import both

PAGE_DOCUMENTS = 1000
MIN_PAGE_DOCUMENTS = 16
PAGE_BYTES = 1024 * 1024
_LAST_CHUNK = b"0\r\n\r\n"
# The collection's documents when the export began (the whole collection,
# whatever the cursor; expired ones not yet pruned counted): a progress bar's total.
COUNT_HEADER = "X-Jetway-Documents"
_log = Logger()


def wants_ndjson(accept: Optional[str]) -> bool:
    """Whether ``Accept`` names NDJSON (and does not refuse it with ``q=0``)."""
    if not accept or NDJSON not in accept:
        return False
    for part in accept.split(","):
        media, *params = [piece.strip() for piece in part.split(";")]
        if media == NDJSON:
            return not any(param.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for param in params)
    return False


def page_lines(page: Page, with_ids: bool, chunked: bool) -> bytes:
    """A page's documents as NDJSON lines (one HTTP/1.1 chunk if ``chunked``).

    The bodies are bytes (``cache.documents.bounded_reads``), joined once:
    PyPy joins bytes far faster than memoryviews, or than the bodies
    interleaved with their newlines (docs/performance.md, "Import and export").
    """
    if not page.bodies:
        return b""
    if with_ids:
        # The last line's closing brace and newline are the tail's, so the lines are copied once more, not twice.
        lines = b"}\n".join([b'{"id":"' + doc_id + b'","doc":' + body for doc_id, body in zip(page.ids, page.bodies)])
        tail = b"}\n"
    else:
        lines, tail = b"\n".join(page.bodies), b"\n"
    if chunked:
        return b"".join((b"%x\r\n" % (len(lines) + len(tail)), lines, tail, b"\r\n"))
    return lines + tail


class NdjsonExport:
    """One export's loop, on its Cyclone handler (``handlers.collections.CollectionHandler``)."""

    def __init__(self, handler: Any, name: bytes) -> None:
        self.handler = handler
        self.name = name
        self.connection = handler.request.connection
        self.chunked = handler.request.supports_http_1_1()
        self.with_ids = with_ids_flag(handler.query_argument("with_ids"))
        self.after = validation.decode_cursor(handler.query_argument("cursor"))
        self.budget = min(handler.response_budget, max(handler.max_body, PAGE_BYTES))
        self.credential_ended: Optional[str] = None
        self.scan: Optional[CollectionScan] = None  # made at the first page: a bound caller's export has none
        self.documents_read = 0
        self.bytes_read = 0

    @defer.inlineCallbacks
    def run(self) -> Any:
        """Reads the first page before the head (so a Redis failure is still a problem), then streams."""
        handler = self.handler
        reading = handler.with_collection_policy(self.name, self._read())
        page, count = yield both(reading, self._count(), lambda page, count: (page, count))
        hold = handler.gate.hold(handler.grant, self._credential_died)
        try:
            self._write_head(count)
            if handler.request.method == "HEAD":
                return
            yield self._stream(page)
        finally:
            if hold is not None:
                hold.release()

    def _read(self) -> defer.Deferred:
        if self.scan is None:
            self.scan = self.handler.store.scan(self.name, self.after, self.budget)
        return self.scan.next_page(self._page_documents())

    def _page_documents(self) -> int:
        """How many documents the next page asks for: ``PAGE_DOCUMENTS``, or half what the budget holds at the
        size of the documents read so far. Not more: ids a page has no room for are read, and measured in
        Redis, for nothing. Not all it holds: each shard is allowed its share of the budget in the first round
        (``bounded_reads``), and with half, a shard whose documents are larger than most still fits its share,
        where a shard short of it waits for a second round."""
        if not self.bytes_read:
            return PAGE_DOCUMENTS
        fitting = self.budget * self.documents_read // self.bytes_read
        return max(MIN_PAGE_DOCUMENTS, min(PAGE_DOCUMENTS, fitting // 2 + 1))

    def _count(self) -> defer.Deferred:
        return self.handler.store.count(self.name)

    def _write_head(self, count: Optional[int]) -> None:
        handler = self.handler
        handler.set_status(200)
        handler.set_header("Content-Type", NDJSON)
        if count is not None:
            handler.set_header(COUNT_HEADER, str(count))
        handler.set_header("Vary", "Accept")
        handler.set_header("Cache-Control", handler.cache_control)
        handler.set_header("X-Accel-Buffering", "no")  # a proxy should pass pages on as they come
        if self.chunked:
            handler.set_header("Transfer-Encoding", "chunked")
        else:
            self.connection.keep_alive = False  # HTTP/1.0: the body ends with the connection
        handler.send_head_now()

    @defer.inlineCallbacks
    def _stream(self, page: Page) -> Any:
        following: Optional[defer.Deferred] = None
        try:
            while True:
                # The next page is asked for before this one is made into lines and sent, and sent to Redis at
                # once: Redis reads it while the worker does that and the network sends (two pages held at most).
                self.documents_read += len(page.bodies)
                self.bytes_read += sum(map(len, page.bodies))
                if page.last_id is not None:
                    self.after = page.last_id
                    with sent_at_once():
                        following = self._read()
                self.connection.transport.write(page_lines(page, self.with_ids, self.chunked))
                if following is None:
                    break
                page = None
                sent = yield self.connection.when_drained()
                if not sent:
                    return  # the client went away, or stopped reading for the send timeout
                if self.credential_ended is not None:
                    raise unauthorized(f"the token ended during the export ({self.credential_ended})")
                page, following = (yield following), None
        except Exception:
            # The head is sent: no problem can follow it. The body ends
            # without its last chunk and the connection closes.
            request = self.handler.request
            problem = problem_of(Failure(), request.method, request.path)  # logs a bug as a 500's would be
            _log.warn("export cut short after {after}: {detail}", after=self.after, detail=problem.detail)
            self.connection.keep_alive = False
            return
        finally:
            if following is not None:
                following.addErrback(lambda _: None)  # a page read for an export that ended: not an error to log
        if self.chunked:
            self.connection.transport.write(_LAST_CHUNK)

    def _credential_died(self, reason: str) -> None:
        self.credential_ended = reason


class OwnedExport(NdjsonExport):
    """A bound caller's export: ``query`` (``_owner=eq.<owner>`` on the owner rule's index) paged through."""

    def __init__(self, handler: Any, name: bytes, query: Query) -> None:
        super().__init__(handler, name)
        self.query = query
        # The owner's encoded value, which every entry of the query starts with (the id follows it).
        self.prefix = query.low[1:]

    def _read(self) -> defer.Deferred:
        after = None if self.after is None else self.prefix + self.after
        query = replace(self.query, limit=self._page_documents(), after=after)
        return self.handler.store.query(self.name, query, self.budget).addCallback(self._page)

    def _page(self, found: Found) -> Page:
        cut = len(self.prefix)
        last = found.last[cut:] if found.last is not None else None
        return Page(found.bodies, last, [entry[cut:] for entry in found.entries])

    def _count(self) -> defer.Deferred:
        return defer.succeed(None)
