"""Parsing and checking an HTTP/1.x request head, strictly.

Strict because a gateway that reads a request differently from the proxy in
front of it can be smuggled a second request: ``Content-Length`` together
with ``Transfer-Encoding``, a negative or conflicting ``Content-Length``, a
header line folded or without a colon are all refused here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from cyclone.httputil import HTTPHeaders

from handlers.framework import RequestHeaders

MAX_REQUEST_LINE = 8192
MAX_HEADER_LINES = 100
MAX_HEADER_BYTES = 65536

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) HTTP/(\d)\.(\d)\Z")
_FORBIDDEN_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# A request line of a method and version that most requests have takes no
# pattern (_request_line): on PyPy every match allocates, and the allocation is the cost.
_COMMON_METHODS = {method.encode(): method for method in ("GET", "HEAD", "PUT", "POST", "PATCH", "DELETE", "OPTIONS")}
_VERSIONS = {b"HTTP/1.1": "HTTP/1.1", b"HTTP/1.0": "HTTP/1.0"}
# Whether a header was sent, without Cyclone normalizing the name asked.
_has = dict.__contains__


_PROBLEMS = {
    400: "malformed-request",
    408: "request-timeout",
    413: "body-too-large",
    414: "request-line-too-long",
    431: "headers-too-large",
    501: "unsupported-transfer-coding",
    503: "server-busy",
    505: "unsupported-http-version",
}


class ProtocolError(Exception):
    """The request cannot be served; the connection answers and closes."""

    def __init__(self, status: int, detail: str, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.problem = _PROBLEMS[status]
        self.headers = headers or {}


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: HTTPHeaders
    content_length: int
    chunked: bool
    keep_alive: bool
    expects_continue: bool

    @property
    def has_body(self) -> bool:
        return self.chunked or self.content_length > 0


def parse_head(block: bytes) -> RequestHead:
    """Parse everything before the blank line that ends a request head."""
    return _head_of(*_parsed_head(block))


# A keep-alive client sends the same head request after request (an SDK reading a document again, a browser's
# poll, wrk). With a provider's JWT that head is ~1 KB, and splitting it and hashing its lines for
# ``_KNOWN_LINES`` were a third of a hot read's cost: a connection compares a head with its last one instead
# (``RepeatedHeads``), one memcmp. Kept only up to this size: an idle connection holds its last head.
MAX_REPEATED_HEAD = 4096
ParsedHead = Tuple[str, str, str, Tuple[Tuple[str, str], ...]]


class RepeatedHeads:
    """``parse_head`` for one connection: a head byte-for-byte its last one is not split or looked up again."""

    __slots__ = ("_block", "_parsed")

    def __init__(self) -> None:
        self._block = b""
        self._parsed: Optional[ParsedHead] = None

    def repeated_end(self, data: bytes) -> int:
        """Where the head that ``data`` starts with ends, if it is the last one again (-1 if not).

        The last head was all before the first CRLF CRLF of its bytes, so
        ``data`` starting with the same bytes and that CRLF CRLF has its
        first one at the same place: found by a comparison, not a search of
        the whole head (docs/identity.md, "What a verified token costs").
        """
        block = self._block
        if self._parsed is not None and data.startswith(block) and data.startswith(b"\r\n\r\n", len(block)):
            return len(block)
        return -1

    def head_in(self, data: bytes) -> Optional[Tuple[RequestHead, int]]:
        """The head ``data`` starts with and the bytes it takes (its CRLF CRLF too); None if it is not all there.

        The last head again is not searched for, split or looked up.
        """
        end = self.repeated_end(data)
        if end > 0:
            assert self._parsed is not None
            return _head_of(*self._parsed), end + 4
        end = data.find(b"\r\n\r\n")
        return (self.parse(data[:end]), end + 4) if end > 0 else None

    def parse(self, block: bytes) -> RequestHead:
        parsed = self._parsed
        if parsed is None or block != self._block:
            parsed = _parsed_head(block)
            if len(block) <= MAX_REPEATED_HEAD:
                self._block, self._parsed = block, parsed
        return _head_of(*parsed)


def _parsed_head(block: bytes) -> ParsedHead:
    """The request line's method, target and version, and each header line's name and value, checked."""
    request_line, *lines = block.split(b"\r\n")
    if len(request_line) > MAX_REQUEST_LINE:
        raise ProtocolError(414, "the request line is too long")
    if len(lines) > MAX_HEADER_LINES:
        raise ProtocolError(431, f"more than {MAX_HEADER_LINES} header lines")
    if len(block) - len(request_line) > MAX_HEADER_BYTES:
        raise ProtocolError(431, f"more than {MAX_HEADER_BYTES} bytes of header lines")
    method, target, version = _request_line(request_line)
    return method, target, version, tuple([_KNOWN_LINES.get(line) or known_line(line) for line in lines])


def _head_of(method: str, target: str, version: str, lines: Tuple[Tuple[str, str], ...]) -> RequestHead:
    headers = RequestHeaders()  # a request's own: handlers may add to it
    for name, value in lines:
        headers.add_normal(name, value)
    return _head(method, target, version, headers)


def _head(method: str, target: str, version: str, headers: HTTPHeaders) -> RequestHead:
    """The head, once its lines are parsed: the framing headers checked (each only when it is there)."""
    chunked = _chunked(headers, version) if _has(headers, "Transfer-Encoding") else False
    content_length = _content_length(headers) if _has(headers, "Content-Length") else None
    if chunked and content_length is not None:
        raise ProtocolError(400, "Content-Length and Transfer-Encoding together")
    keep_alive = _keep_alive(headers, version) if _has(headers, "Connection") else version == "HTTP/1.1"
    return RequestHead(
        method=method,
        target=target,
        version=version,
        headers=headers,
        content_length=content_length or 0,
        chunked=chunked,
        keep_alive=keep_alive,
        expects_continue=_has(headers, "Expect") and headers["Expect"].lower() == "100-continue",
    )


def _request_line(line: bytes) -> Tuple[str, str, str]:
    """The method, target and version; raises saying which rule the line breaks."""
    parts = line.split(b" ")
    if len(parts) == 3 and parts[0] in _COMMON_METHODS and parts[2] in _VERSIONS and parts[1].isascii():
        # Split on spaces, an ASCII target with no control character is the
        # pattern's [\x21-\x7e]+ (DEL and the controls are not printable).
        target = parts[1].decode("ascii")
        if target and target.isprintable():
            return _COMMON_METHODS[parts[0]], target, _VERSIONS[parts[2]]
    return request_line_by_pattern(line)


def request_line_by_pattern(line: bytes) -> Tuple[str, str, str]:
    """``_request_line`` for any line: every method token and HTTP version, by the one pattern."""
    match = _REQUEST_LINE.match(line)
    if not match:
        raise ProtocolError(400, "malformed request line")
    method, target, major, minor = match.groups()
    if major != b"1":
        raise ProtocolError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    version = "HTTP/1.1" if minor != b"0" else "HTTP/1.0"
    return method.decode("ascii"), target.decode("ascii"), version


# Header lines seen before, parsed: a client sends the same lines request
# after request (its Host, User-Agent, Accept, token), and a line found here
# passed the checks below already. Checking each line again costs pattern
# matches, and on PyPy each match allocates, the cost that counted
# (docs/history/performance.md, "The changes, in the order done"). Bounded:
# emptied when full, so made-up lines cost memory no longer than the next clear.
MAX_KNOWN_LINES = 1024
# Long enough for a provider's JWT in an Authorization line (a few KB at most, docs/identity.md): 1,024 lines of
# it are a few MB at worst, until the next clear.
MAX_KNOWN_LINE_LENGTH = 4096
_KNOWN_LINES: Dict[bytes, Tuple[str, str]] = {}


def known_line(line: bytes) -> Tuple[str, str]:
    """A header line's name (in Http-Header-Case) and value, checked; raises if it breaks a rule.

    A short line is remembered in ``_KNOWN_LINES`` for the next request that sends it.
    """
    name, colon, value = line.partition(b":")
    # No colon, a space before it, or a folded continuation line: refused.
    if not colon or not _TOKEN.match(name):
        raise ProtocolError(400, "malformed header line")
    value = value.strip(b" \t")
    if _FORBIDDEN_IN_VALUE.search(value):
        raise ProtocolError(400, "control character in a header value")
    parsed = normal_name(name.decode("ascii")), value.decode("latin-1")
    if len(line) <= MAX_KNOWN_LINE_LENGTH:
        if len(_KNOWN_LINES) >= MAX_KNOWN_LINES:
            _KNOWN_LINES.clear()
        _KNOWN_LINES[line] = parsed
    return parsed


# The names clients send are a few dozen; longer or more are normalized each time.
MAX_KNOWN_NAMES = 512
MAX_KNOWN_NAME_LENGTH = 64
_KNOWN_NAMES: Dict[str, str] = {}
_NORMAL_NAME = re.compile(r"[A-Z0-9][a-z0-9]*(-[A-Z0-9][a-z0-9]*)*\Z")


def normal_name(name: str) -> str:
    """``name`` in Http-Header-Case, as Cyclone's ``HTTPHeaders`` writes it."""
    known = _KNOWN_NAMES.get(name)
    if known is not None:
        return known
    normal = name if _NORMAL_NAME.match(name) else "-".join([word.capitalize() for word in name.split("-")])
    if len(_KNOWN_NAMES) < MAX_KNOWN_NAMES and len(name) <= MAX_KNOWN_NAME_LENGTH:
        _KNOWN_NAMES[name] = normal
    return normal


def _values(headers: HTTPHeaders, name: str) -> List[str]:
    """Every comma-separated element of every ``name`` header line."""
    return [part.strip() for line in headers.get_list(name) for part in line.split(",") if part.strip()]


def _content_length(headers: HTTPHeaders) -> Optional[int]:
    lines = headers.get_list("Content-Length")
    if not lines:
        return None
    if len(lines) == 1 and lines[0].isdigit() and lines[0].isascii() and len(lines[0]) <= 18:
        return int(lines[0])  # the usual one plain number, as the rules read it, without their lists and set
    return content_length_by_rules(headers)


def content_length_by_rules(headers: HTTPHeaders) -> int:
    """The one length of every ``Content-Length`` line and element; raises if they differ or one is not a number."""
    values = set(_values(headers, "Content-Length"))
    if len(values) != 1:
        raise ProtocolError(400, "conflicting Content-Length values")
    (value,) = values
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise ProtocolError(400, "Content-Length is not a non-negative integer")
    return int(value)


def _chunked(headers: HTTPHeaders, version: str) -> bool:
    if not headers.get_list("Transfer-Encoding"):
        return False
    if version == "HTTP/1.0":
        raise ProtocolError(400, "Transfer-Encoding in an HTTP/1.0 request")
    codings = [coding.lower() for coding in _values(headers, "Transfer-Encoding")]
    if codings != ["chunked"]:
        raise ProtocolError(501, "only the chunked transfer coding is supported")
    return True


def _keep_alive(headers: HTTPHeaders, version: str) -> bool:
    tokens = {token.lower() for token in _values(headers, "Connection")}
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens
