"""What a failure answers: the problem (RFC 9457) every known error maps to, and its reply.

Every error, whether raised by a pipeline's step, a handler, the store or
Cyclone itself (unknown route, unsupported method), becomes an ``ApiError``
here and only here; an error that maps to none is a bug, logged with its
traceback and answered 500.
"""

from __future__ import annotations

import http
from typing import Any, Dict, Iterable, Optional, Tuple, Type

import cyclone.web
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from cache.collection_settings import OverCollectionLimit, StoredSchemaRefused, StoredSettingsRefused
from cache.documents.bounded_reads import OverBudget
from cache.errors import (
    DocumentNotFound,
    DocumentNotIndexable,
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
from cache.indexes.queries import IndexNotReady
from cache.json import codec
from cache.schemas.schema import DocumentInvalid
from handlers.http.cache_policy import ERROR_POLICY
from handlers.http.errors import ApiError, not_found, precondition_failed
from handlers.http.reply import PROBLEM_TYPE, Reply

# How long a client should wait before retrying while Redis is unreachable.
RETRY_AFTER_SECONDS = "1"
_log = Logger()

_STORE_ERRORS: Dict[Type[Exception], Any] = {
    # Before RedisReplyError, its base: the first type that matches maps the error.
    DocumentNotIndexable: lambda e: ApiError(422, "not-indexable", str(e)),
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
    # A bound caller's read of many documents while the owner rule's index is built (cache.ownership.OwnedReads).
    IndexNotReady: lambda e: ApiError(409, "index-building", str(e), {"Retry-After": RETRY_AFTER_SECONDS}),
    DocumentInvalid: lambda e: ApiError(
        422, "schema-violation", str(e), extensions={"errors": [v.as_json() for v in e.violations]}
    ),
    codec.JsonError: lambda e: ApiError(422, "unrepresentable", str(e)),
}


def too_large(error: OverBudget) -> ApiError:
    """The problem of an answer past its budget: 413, as this API's other "too large" (docs/limits.md)."""
    return ApiError(413, "response-too-large", str(error), extensions={"size": error.size, "limit": error.budget})


def rate_limited(rate: Any) -> ApiError:
    """The 429 of a request over its token's rate (a ``cache.credentials.ratelimit.RateDecision`` that refused it)."""
    retry = str(max(1, rate.retry_after))
    return ApiError(429, "rate-limited", f"over the token's rate; retry in {retry} s", {"Retry-After": retry})


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


def problem_of(failure: Any, method: str, path: str) -> ApiError:
    """The problem a request's failure (a ``Failure`` or an exception) answers; a bug is logged and is a 500."""
    error = failure.value if hasattr(failure, "value") else failure
    if isinstance(error, RedisReplyError):
        # The class tells an operator what happened; the client's body never carries it.
        _log.warn(
            "Redis answered {method} {path} with {redis_error}", method=method, path=path, redis_error=error.error_class
        )
    problem = as_api_error(error)
    if problem is None:
        # At error, not critical (where the legacy log.err puts it): one request failed, the worker goes on.
        caught = failure if isinstance(failure, Failure) else Failure(failure)
        _log.failure("unhandled error in {method} {path}", caught, LogLevel.error, method=method, path=path)
        problem = ApiError(500, "internal", "the server failed to handle the request")
    return problem


def problem_reply(
    problem: ApiError, rate_headers: Iterable[Tuple[str, str]] = (), allow: Optional[str] = None, trace: Any = None
) -> Reply:
    """The reply of ``problem``: never cached, with the request's rate headers and the problem's own.

    A header the problem names again (a 429's ``Retry-After``) keeps its
    first place and takes the problem's value, as Cyclone's ``set_header``.
    A traced request's (``trace``, an ``api.tracing.RequestTrace``) carries
    its trace id as the problem's ``trace_id`` member, beside the
    ``X-Request-ID`` header, so a client's report leads to the trace (its
    ``traceparent`` header is the head's: ``Reply.head``).
    """
    headers = {"Cache-Control": ERROR_POLICY}
    if allow is not None:
        headers["Allow"] = allow
    for name, value in rate_headers:
        headers[name] = value
    for name, value in problem.headers.items():
        headers[name] = value
    members = problem.as_problem()
    if trace is not None:
        members["trace_id"] = trace.trace_id
    return Reply(problem.status_code, PROBLEM_TYPE, list(headers.items()), codec.dumps(members))
