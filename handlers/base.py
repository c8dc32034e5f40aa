"""The JSON base handler: explicit content types and problem+json errors.

Every error, whether raised by a handler, by the store or by Cyclone itself
(unknown route, unsupported method), is rendered here and only here.
"""

from __future__ import annotations

import http
import re
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union
from urllib.parse import parse_qs

import cyclone.web
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python import log
from twisted.python.failure import Failure

from cache import codec
from cache.bounded_reads import OverBudget
from cache.collection_settings import (
    NO_SETTINGS,
    CollectionSettings,
    OverCollectionLimit,
    StoredSchemaRefused,
    StoredSettingsRefused,
)
from cache.errors import (
    DocumentNotFound,
    DocumentTooLarge,
    NotReplicated,
    PreconditionFailed,
    RedisNotReady,
    RedisOutOfMemory,
    RedisReplyError,
    RedisTimeout,
    RedisUnavailable,
    WriteConflict,
)
from cache.idempotency import IdempotencyRecords, StoredResponse
from cache.ratelimit import RateDecision
from cache.schema import DocumentInvalid
from cache.settings_cache import SettingsCache
from cache.store import Document, DocumentStore
from cache.variants import gzip_of
from handlers.http import validation
from handlers.http.auth import RATE_SCRIPTS, Gate, Grant
from handlers.http.cache_policy import ERROR_POLICY
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError, bad_request, not_found, precondition_failed
from handlers.http.negotiation import IDENTITY, Negotiator, Preference
from handlers.http.representation import negotiate, represent

JSON_TYPE = "application/json"
PROBLEM_TYPE = "application/problem+json"
# How long a client should wait before retrying while Redis is unreachable.
RETRY_AFTER_SECONDS = "1"
_log = Logger()
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
# What every response names its server as (the direct read's head too, handlers/direct_read.py).
SERVER = "jetway"
# What Cyclone refuses in a header value (against header injection), compiled once.
_UNSAFE_HEADER_VALUE = re.compile(r"[\x00-\x1f]")
MAX_HEADER_VALUE = 4000
# What a list page can be sent as besides its bytes (made as it is sent, see send_composed).
_GZIP_ON_THE_FLY = (("gzip", b""),)

_STORE_ERRORS: Dict[Type[Exception], Any] = {
    RedisUnavailable: lambda e: ApiError(
        503, "redis-unavailable", "Redis cannot be reached", {"Retry-After": RETRY_AFTER_SECONDS}
    ),
    RedisTimeout: lambda e: ApiError(504, "redis-timeout", "Redis did not answer in time"),
    RedisOutOfMemory: lambda e: ApiError(
        507, "redis-out-of-memory", "Redis is out of memory and refuses writes; free space before writing again"
    ),
    RedisNotReady: lambda e: ApiError(
        503,
        "redis-not-ready",
        "Redis is failing over, loading or busy; retry shortly",
        {"Retry-After": RETRY_AFTER_SECONDS},
    ),
    RedisReplyError: lambda e: ApiError(502, "redis-error", "Redis answered with an error"),
    NotReplicated: lambda e: ApiError(
        503,
        "not-replicated",
        str(e) + "; check with GET, or retry with If-Match" + ("" if e.etag is None else f" {e.etag.decode()}"),
        {"Retry-After": RETRY_AFTER_SECONDS, **({} if e.etag is None else {"ETag": e.etag.decode()})},
    ),
    DocumentNotFound: lambda e: not_found(),
    PreconditionFailed: lambda e: precondition_failed(),
    WriteConflict: lambda e: ApiError(409, "write-conflict", "too many concurrent writers; retry"),
    DocumentTooLarge: lambda e: ApiError(413, "body-too-large", str(e)),
    OverCollectionLimit: lambda e: ApiError(413, "body-too-large", str(e)),
    OverBudget: lambda e: too_large(e),
    # The request is fine; the collection's state refuses it until an admin replaces the setting.
    StoredSchemaRefused: lambda e: ApiError(409, "stored-schema-refused", str(e)),
    StoredSettingsRefused: lambda e: ApiError(409, "stored-settings-refused", str(e)),
    DocumentInvalid: lambda e: ApiError(
        422, "schema-violation", str(e), extensions={"errors": [v.as_json() for v in e.violations]}
    ),
    codec.JsonError: lambda e: ApiError(422, "unrepresentable", str(e)),
}


def too_large(error: OverBudget) -> ApiError:
    """The problem of an answer past its budget: 413, as this API's other "too large" (docs/limits.md)."""
    return ApiError(413, "response-too-large", str(error), extensions={"size": error.size, "limit": error.budget})


def as_api_error(error: BaseException) -> Optional[ApiError]:
    """The ``ApiError`` a known failure maps to, or None for a bug."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, cyclone.web.HTTPError):
        # Cyclone's own (405 for an unsupported method): same status, as a problem.
        phrase = http.HTTPStatus(error.status_code).phrase
        return ApiError(error.status_code, phrase.lower().replace(" ", "-"), phrase)
    for error_type, make in _STORE_ERRORS.items():
        if isinstance(error, error_type):
            return make(error)
    return None


class JsonHandler(cyclone.web.RequestHandler):
    """Base of every handler: bytes out with an explicit type, errors as data."""

    SUPPORTED_METHODS: Tuple[str, ...] = ("GET", "HEAD", "OPTIONS")
    ROUTE = "unknown"  # the metrics label of the handler's route
    request_id = ""
    _cors_lines = b""  # this response's CORS header lines (handlers/http/cors.py)

    def __init__(self, application: Any, request: Any, **kwargs: Any) -> None:
        # Cyclone's own __init__ also builds the template helpers (ui
        # modules and methods) for every request; a JSON API has none.
        self.application = application
        self.request = request
        self._headers_written = False
        self._finished = False
        self._auto_finish = True
        self.path_args = None
        self.path_kwargs = None
        self.clear()
        self.request.connection.no_keep_alive = self.no_keep_alive
        self.initialize(**kwargs)

    def clear(self) -> None:
        """Reset the response (Cyclone's ``clear``, with the Date string cached per second)."""
        self._headers = {"Server": SERVER, "Content-Type": JSON_TYPE, "Date": self.application.http_date()}
        self._list_headers = []
        self._write_buffer = []
        self._status_code = 200
        self._reason = "OK"
        self.set_default_headers()

    def _execute(self, transforms: Any, *args: str) -> None:
        """Cyclone's ``_execute``, without Deferreds where nothing waits.

        Cyclone wrapped ``prepare`` and the method each in a Deferred, made
        a third for ``notifyFinish`` on every request, and decoded the path
        arguments twice. Here a ``prepare`` or a method that returns a
        Deferred is waited for, one that returns at once is not, and only a
        handler that overrides ``on_connection_close`` watches for the
        client going away (the change feed's). Errors go to
        ``_handle_request_exception`` as before, with their traceback.
        """
        self._transforms = transforms
        try:
            if self.request.method not in self.SUPPORTED_METHODS:
                raise cyclone.web.HTTPError(405)
            self.path_args = [self.decode_argument(arg) for arg in args]
            self.path_kwargs = {}
            prepared = self.prepare()
        except Exception:
            self._handle_request_exception(Failure())
            return
        if is_deferred(prepared):
            prepared.addCallbacks(self._run_method, self._handle_request_exception)
        else:
            self._run_method(None)

    def _run_method(self, _: Any) -> None:
        """The request's method, once ``prepare`` is done; the response finished after it unless it did."""
        if self._finished:
            return
        method = getattr(self, self.request.method.lower(), self.default)
        try:
            result = method(*self.path_args)
        except Exception:
            self._handle_request_exception(Failure())
            return
        if is_deferred(result):
            result.addCallbacks(self._execute_success, self._execute_failure)
        else:
            self._execute_success(result)
        if type(self).on_connection_close is not cyclone.web.RequestHandler.on_connection_close:
            self.notifyFinish().addCallback(self.on_connection_close)

    def set_default_headers(self) -> None:
        # Also runs when an error resets the headers, so errors carry the id
        # and the CORS headers too.
        if not self.request_id:
            self.request_id = request_id_of(self.request.headers.get("X-Request-ID"), self.application.new_request_id)
        self._headers["X-Request-ID"] = self.request_id
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

    def _convert_header_value(self, value: Any) -> str:
        """Cyclone's check of a header value, with its pattern compiled once.

        Cyclone's ``re.search`` with the pattern's text looks it up in
        ``re``'s cache on every header of every response.
        """
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, int):
            # Content-Length on every response. Cyclone asks numbers.Integral,
            # an ABC: ~4% of an in-process read's samples went to PyPy's ABC
            # cache lookup (python -m loadtest._request_path --profile get).
            return str(value)
        elif not isinstance(value, str):
            return super()._convert_header_value(value)  # other numbers and dates, formatted as Cyclone does
        if len(value) > MAX_HEADER_VALUE or _UNSAFE_HEADER_VALUE.search(value):
            raise ValueError("Unsafe header value %r", value)
        return value

    def compute_etag(self) -> None:
        # ETags are stored with each document; never hash a body per read.
        return None

    def write(self, chunk: Any) -> None:
        """Cyclone's ``write``, into a list made now rather than the one made with the handler.

        The handler is usually in PyPy's old generation by the time it
        answers (a minor collection came while it waited for Redis), and a
        body appended to a list as old as the handler would be kept through
        the next minor collection, sent or not (``cache.redis.resp._reply_received``
        says more).
        """
        self._write_buffer = list(self._write_buffer)
        super().write(chunk)

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

    def send_stored(self, response: StoredResponse) -> None:
        """Send a response made ahead (``cache.idempotency``: perhaps the first attempt's, replayed)."""
        for name, value in response.headers:
            self.set_header(name, value)
        if response.status >= 400:
            self.set_header("Cache-Control", ERROR_POLICY)
        self.set_status(response.status)
        if response.body:
            self.write(response.body)

    def _generate_headers(self) -> bytes:
        self._set_connection_header()
        if self._status_code == 204:
            # RFC 9110: a 204 carries neither Content-Length nor a body type;
            # Cyclone adds both to every response.
            self._headers.pop("Content-Length", None)
            self._headers.pop("Content-Type", None)
        # Cyclone's head, encoded once rather than per name and value, from
        # one list of parts joined once (a string per line, then the lines
        # joined, then a copy per concatenation took 0.74 against 0.45-0.51
        # µs for a read's head in a PyPy warm loop); the CORS lines (bytes,
        # made once per origin) before its blank line.
        parts = [self.request.version, " ", str(self._status_code), " ", self._reason, "\r\n"]
        for name, value in self._headers.items():
            parts += (name, ": ", value, "\r\n")
        for name, value in self._list_headers:
            parts += (name, ": ", value, "\r\n")
        if not self._cors_lines:
            parts.append("\r\n")
            return "".join(parts).encode()
        return "".join(parts).encode() + self._cors_lines + b"\r\n"

    def _set_connection_header(self) -> None:
        connection = self.request.connection
        if getattr(connection, "closing", False) or not getattr(connection, "keep_alive", True):
            # Draining, or the client asked: this connection ends here.
            self._headers["Connection"] = "close"
        elif not self.request.supports_http_1_1():
            self._headers["Connection"] = "keep-alive"  # HTTP/1.0 keeps it only when told
        else:
            self._headers.pop("Connection", None)

    def query_argument(self, name: str) -> Optional[str]:
        """A query parameter given at most once (blank counts as given)."""
        values = self.query_arguments(name)
        if not values:
            return None
        if len(values) > 1:
            raise bad_request(f"{name} may be given only once", f"invalid-{name}")
        return values[0]

    def query_arguments(self, name: str) -> List[str]:
        """Every value of a query parameter, in order (blank counts as given)."""
        return parse_qs(self.request.query, keep_blank_values=True).get(name, [])

    def _handle_request_exception(self, e: Any) -> None:
        error = e.value if isinstance(e, Failure) else e
        api_error = as_api_error(error)
        if isinstance(error, RedisReplyError):
            # The class tells an operator what happened; the client's body never carries it.
            _log.warn(
                "Redis answered {method} {path} with {redis_error}",
                method=self.request.method,
                path=self.request.path,
                redis_error=error.error_class,
            )
        if api_error is None:
            log.err(e, f"unhandled error in {self.request.method} {self.request.path}")
            api_error = ApiError(500, "internal", "the server failed to handle the request")
        super()._handle_request_exception(api_error)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = as_api_error(kwargs.get("exception")) or as_api_error(cyclone.web.HTTPError(status_code))
        self.set_header("Cache-Control", ERROR_POLICY)
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.SUPPORTED_METHODS))
        for name, value in (*getattr(self, "rate_headers", ()), *error.headers.items()):
            self.set_header(name, value)
        self.set_header("Content-Type", PROBLEM_TYPE)
        self.finish(codec.dumps(error.as_problem()))


def request_id_of(given: Optional[str], new_request_id: Callable[[], str]) -> str:
    """The request's id: the one the client gave (its ``X-Request-ID``) when it is a sane one, else a new one."""
    return given if given and _REQUEST_ID.match(given) else new_request_id()


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

    def collection_settings(self, collection: bytes) -> defer.Deferred:
        """The collection's settings (``NO_SETTINGS`` when it has none): what a write must obey."""
        if self.collections is None:
            return defer.succeed(NO_SETTINGS)
        return self.collections.get(collection.decode()).addCallback(lambda found: found or NO_SETTINGS)

    def known_collection_settings(self, collection: bytes) -> Optional[CollectionSettings]:
        """The collection's settings if this worker knows them now (no Deferred, no Redis); else None."""
        if self.collections is None:
            return NO_SETTINGS
        return self.collections.peek(collection.decode())

    def with_collection_policy(self, collection: bytes, reading: defer.Deferred) -> defer.Deferred:
        """``reading``, once the collection's ``cache_control`` (if it has one) replaces the default.

        Known settings cost a dictionary lookup; unknown ones (the first
        read of a collection on this worker, or every read while the
        settings subscription is down) are read alongside ``reading``, not
        before it.
        """
        if self.use_known_policy(collection):
            return reading
        return self.collection_settings(collection).addCallbacks(
            self._policy_then, self._drop_reading, callbackArgs=(reading,), errbackArgs=(reading,)
        )

    def use_known_policy(self, collection: bytes) -> bool:
        """Whether the collection's settings are known here (a dictionary lookup); if so, its policy is applied."""
        known = self.known_collection_settings(collection)
        if known is None:
            return False
        self._use_policy(known)
        return True

    def _use_policy(self, settings: CollectionSettings) -> None:
        if settings.cache_control is not None:
            self.cache_control = settings.cache_control

    def _policy_then(self, settings: CollectionSettings, reading: defer.Deferred) -> defer.Deferred:
        self._use_policy(settings)
        return reading

    @staticmethod
    def _drop_reading(failure: Failure, reading: defer.Deferred) -> Failure:
        reading.addErrback(lambda _: None)  # the settings' error is the answer; the read's is not logged
        return failure

    def writes(self) -> bool:
        """Whether the request needs write scope (a multi-get by POST does not)."""
        return self.request.method not in ("GET", "HEAD")

    def send_representation(self, document: Document) -> None:
        """Answer a read of ``document``: the form the client accepts best, or a 304 (handlers.http.representation)."""
        self.set_header("Cache-Control", self.cache_control)
        chosen = represent(document, self.request.headers, self._accepted())
        if chosen.vary:
            self.add_header("Vary", "Accept-Encoding")
        if chosen.status == 304:
            self.send_not_modified(chosen.etag)
            return
        self.set_header("ETag", chosen.etag)
        self.set_header("Last-Modified", document.last_modified)
        if chosen.coding != IDENTITY:
            self.set_header("Content-Encoding", chosen.coding)
        self.send_bytes(200, chosen.body)

    def send_composed(self, body: bytes) -> None:
        """A list page or a multi-get (put together from stored bytes), gzipped as it is sent if the client prefers.

        Only bodies of at least ``compress_min_bytes``, as for documents: a
        page of 100 documents of 200 B (20 KB) gzips in ~16 µs on PyPy, a
        few percent of its request, to about a fifth of its size
        (docs/api.md, "HTTP caching and compression").
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
        A CRC-32 and the length: 3 µs for 20 KB on PyPy (MD5 26, SHA-1 19).
        """
        opaque = b'"%08x-%x"' % (zlib.crc32(body), len(body))
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
        if self.request.method == "OPTIONS":
            return None  # a CORS preflight carries no credentials
        if self.handed() is not None:
            return None  # admitted already, by the direct read or write that handed it over
        reading = not self.writes()
        # A document read sends its rate step in one pipeline with the read.
        defer_rate = reading and len(self.path_args) == 2
        authorization = self.request.headers.get("Authorization")
        outcome = self.gate.grant_or_wait(authorization, self.path_args[0], not reading, defer_rate)
        if is_deferred(outcome):
            return outcome.addCallback(self._admitted)
        self._admitted(outcome)  # the usual case: admitted at once, no Deferred
        return None

    def _admitted(self, grant: Grant) -> None:
        self.grant = grant
        self.apply_rate(grant.rate)

    def read_document(self, collection: bytes, doc_id: bytes) -> Union[Document, defer.Deferred]:
        """The document (or None), with the pending rate step if there is one.

        The document itself when the worker's hot cache holds it, no rate
        step waits for Redis and the request's ``Cache-Control`` does not ask
        for a fresh one; else a Deferred of it.
        """
        handed = self.handed()
        if handed is not None:  # the direct read asked Redis already: its outcome, not a second read
            return handed.fired()
        fresh = validation.wants_fresh(self.request.headers.get("Cache-Control"))
        if self.grant.pending_rate is None:
            return self.store.get_or_wait(collection, doc_id, fresh)
        return self.store.get_along(collection, doc_id, self.grant.pending_rate, RATE_SCRIPTS, fresh).addCallback(
            self._settle_rate
        )

    def handed(self) -> Any:
        """The ``DirectAnswer`` of the direct read or write that handed this request over, or None.

        It answers 200, 304 and a write's 201 itself, and hands over the
        rest (``handlers/direct_answer.py``) with what it had from the store,
        which the handler answers from rather than asking Redis again.
        """
        return getattr(self.request, "direct_answer", None)

    def _settle_rate(self, reply: Tuple[Any, Optional[Document]]) -> Optional[Document]:
        rate, document = reply
        self.apply_rate(self.grant.settle(rate))
        return document

    def apply_rate(self, rate: Optional[RateDecision]) -> None:
        if rate is None:
            return
        self.rate_headers = rate.headers()
        for name, value in self.rate_headers:
            self.set_header(name, value)
        if not rate.allowed:
            retry = str(max(1, rate.retry_after))
            raise ApiError(429, "rate-limited", f"over the token's rate; retry in {retry} s", {"Retry-After": retry})
