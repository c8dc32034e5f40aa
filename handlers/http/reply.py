"""A response as data, and the one writer of every response's head.

An operation's pipeline (``handlers.pipeline``) ends in a ``Reply``; the
connection sends it itself (``api.connection``), or a Cyclone handler sends
it (``handlers.base.JsonHandler.send_reply``). Either way its head comes
from ``response_head``, as does the head of every other handler's response
(``handlers.framework``) and of the front door's refusals: one writer, so
the two ways cannot drift apart by a byte.

A head's order is Cyclone's: its defaults (``Server``, ``Content-Type``,
``Date``, ``X-Request-ID``), what the operation set, ``Content-Length``,
``Connection`` when the connection ends, the list headers (``Vary``), then
the CORS lines.
"""

from __future__ import annotations

import http
import re
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

JSON_TYPE = "application/json"
PROBLEM_TYPE = "application/problem+json"
# What every response names its server as.
SERVER = "jetway"
Headers = List[Tuple[str, str]]
# The reason phrase of each status, as Cyclone's ``set_status`` gives it.
REASONS = {status.value: status.phrase for status in http.HTTPStatus}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
_VARY = (("Vary", "Accept-Encoding"),)
# Statuses whose head carries no Content-Length (RFC 9110 8.6: a 304's would describe another response).
_NO_LENGTH = (204, 304)


class Reply:
    """A response: status, body type (None: no ``Content-Type``), headers in order, body.

    ``vary``: the answer depends on ``Accept-Encoding``. ``kind``: what the
    metrics count a reply the connection sent itself as
    (``jetway_direct_answers_total``).
    """

    __slots__ = ("body", "content_type", "headers", "kind", "status", "vary")

    def __init__(
        self,
        status: int,
        content_type: Optional[str],
        headers: Headers,
        body: bytes,
        vary: bool = False,
        kind: str = "error",
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.body = body
        self.vary = vary
        self.kind = kind

    def header_lines(self, date: str, request_id: str) -> Headers:
        """Every header of the head but the list headers, in Cyclone's order."""
        lines = [("Server", SERVER)]
        if self.content_type is not None:
            lines.append(("Content-Type", self.content_type))
        lines += (("Date", date), ("X-Request-ID", request_id))
        lines += self.headers
        if self.status not in _NO_LENGTH:
            lines.append(("Content-Length", str(len(self.body))))
        return lines

    def list_headers(self) -> Sequence[Tuple[str, str]]:
        return _VARY if self.vary else ()


def response_head(
    version: str,
    status: int,
    reason: str,
    headers: Iterable[Tuple[str, str]],
    list_headers: Iterable[Tuple[str, str]] = (),
    cors_lines: bytes = b"",
) -> bytes:
    """The head's bytes: the status line, ``headers``, ``list_headers``, the CORS lines, the blank line.

    One list of parts joined once and encoded once: a string per line, then
    the lines joined, cost half as much again on PyPy (docs/performance.md).
    """
    parts = [version, " ", str(status), " ", reason, "\r\n"]
    for name, value in headers:
        parts += (name, ": ", value, "\r\n")
    for name, value in list_headers:
        parts += (name, ": ", value, "\r\n")
    if not cors_lines:
        parts.append("\r\n")
        return "".join(parts).encode()
    return "".join(parts).encode() + cors_lines + b"\r\n"


def request_id_of(given: Optional[str], new_request_id: Callable[[], str]) -> str:
    """The request's id: the one the client gave (its ``X-Request-ID``) when it is a sane one, else a new one."""
    return given if given and _REQUEST_ID.match(given) else new_request_id()
