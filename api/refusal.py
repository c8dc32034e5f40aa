"""The answer to a request refused before it is understood (``api.connection``): its problem, and the close.

It carries none of the handlers' defaults (``Server``, ``Date``, the
request's id): no handler saw the request.
"""

from __future__ import annotations

from typing import List, Tuple

from api.request_head import ProtocolError
from cache.json import codec
from handlers.http.cache_policy import ERROR_POLICY
from handlers.http.errors import ApiError
from handlers.http.reply import PROBLEM_TYPE, REASONS, header_parts, response_head


def refusal(error: ProtocolError, cors: List[Tuple[str, str]]) -> bytes:
    """The whole response: ``error``'s problem, the ``cors`` headers (a page on an allowed origin reads it too)."""
    body = codec.dumps(ApiError(error.status, error.problem, error.detail).as_problem())
    lines = [("Content-Type", PROBLEM_TYPE), ("Content-Length", str(len(body))), *error.headers.items()]
    lines += [("Cache-Control", ERROR_POLICY), *cors, ("Connection", "close")]
    return response_head("HTTP/1.1", error.status, REASONS[error.status], header_parts(lines)) + body
