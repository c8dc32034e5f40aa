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
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

JSON_TYPE = "application/json"
PROBLEM_TYPE = "application/problem+json"
# What every response names its server as.
SERVER = "jetway"
Headers = List[Tuple[str, str]]
# The reason phrase of each status, as Cyclone's ``set_status`` gives it.
REASONS = {status.value: status.phrase for status in http.HTTPStatus}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
# Statuses whose head carries no Content-Length (RFC 9110 8.6: a 304's would describe another response).
_NO_LENGTH = (204, 304)


@dataclass(eq=False)
class Reply:
    """A response: status, body type (None: no ``Content-Type``), headers in order (after Cyclone's
    defaults), body.

    ``vary``: the answer depends on ``Accept-Encoding``. ``kind``: what the
    metrics count a reply the connection sent itself as
    (``jetway_direct_answers_total``).
    """

    status: int
    content_type: Optional[str]
    headers: Headers
    body: bytes
    vary: bool = False
    kind: str = "error"

    def head(
        self,
        version: str,
        date: str,
        request_id: str,
        connection: Optional[str],
        cors_lines: bytes,
        trace: Any = None,
    ) -> bytes:
        """The reply's head (``response_head``), with a ``Connection`` header when ``connection`` is given.

        ``trace``: a traced request's (``api.tracing``), whose ``traceparent``
        (W3C Trace Context) follows the reply's own headers. Written here, not
        added to ``headers``: a copy of the reply per traced request cost PyPy
        more than its header line.
        """
        status = self.status
        parts = [_DEFAULTS_TYPED if self.content_type == JSON_TYPE else _defaults(self.content_type)]
        parts += (date, "\r\nX-Request-ID: ", request_id, "\r\n")
        for name, value in self.headers:
            parts += (name, ": ", value, "\r\n")
        if trace is not None:
            parts += ("traceparent: ", trace.traceparent, "\r\n")
        if status not in _NO_LENGTH:
            parts += ("Content-Length: ", str(len(self.body)), "\r\n")
        if connection is not None:
            parts += ("Connection: ", connection, "\r\n")
        if self.vary:
            parts.append("Vary: Accept-Encoding\r\n")
        return response_head(version, status, REASONS[status], parts, cors_lines)


# A reply's head up to its Date's value: Cyclone's defaults (Server, Content-Type, Date) in its order.
_DEFAULTS_TYPED = f"Server: {SERVER}\r\nContent-Type: {JSON_TYPE}\r\nDate: "


def _defaults(content_type: Optional[str]) -> str:
    typed = "" if content_type is None else f"Content-Type: {content_type}\r\n"
    return f"Server: {SERVER}\r\n{typed}Date: "


def response_head(version: str, status: int, reason: str, parts: List[str], cors_lines: bytes = b"") -> bytes:
    """A head's bytes: the status line, the header lines ``parts`` make when joined, the CORS lines, the blank line.

    Every head goes through here: a pipeline's reply (``Reply.head``), a
    Cyclone handler's (``handlers.framework``) and a refusal at the front
    door (``api.connection``). One list of parts joined once and encoded
    once: a string per line, then the lines joined, cost half as much again
    on PyPy (docs/performance.md).
    """
    lines = _STATUS_LINES.get(version)
    if lines is None:
        lines = _STATUS_LINES[version] = {}
    line = lines.get(status)
    if line is None:
        line = lines[status] = f"{version} {status} {reason}\r\n"
    head = line + "".join(parts)
    if not cors_lines:
        return (head + "\r\n").encode()
    return head.encode() + cors_lines + b"\r\n"


def header_parts(headers: Iterable[Tuple[str, str]]) -> List[str]:
    """``headers`` as the parts of their lines, for ``response_head``."""
    parts: List[str] = []
    for name, value in headers:
        parts += (name, ": ", value, "\r\n")
    return parts


# The status lines made so far, by version and status.
_STATUS_LINES: Dict[str, Dict[int, str]] = {}


def request_id_of(given: Optional[str], new_request_id: Callable[[], str]) -> str:
    """The request's id: the one the client gave (its ``X-Request-ID``) when it is a sane one, else a new one."""
    return given if given and _REQUEST_ID.match(given) else new_request_id()
