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

MAX_REQUEST_LINE = 8192
MAX_HEADER_LINES = 100
MAX_HEADER_BYTES = 65536

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) HTTP/(\d)\.(\d)\Z")
_FORBIDDEN_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# A whole head that breaks none of the rules above: a request line, then header
# lines of a token, a colon and a value of allowed characters. One match, not
# two patterns and a split per line (parse_head).
_WELL_FORMED = re.compile(
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [\x21-\x7e]+ HTTP/\d\.\d"
    rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*\Z"
)
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
    request_line, *lines = block.split(b"\r\n")
    if len(request_line) > MAX_REQUEST_LINE:
        raise ProtocolError(414, "the request line is too long")
    if len(lines) > MAX_HEADER_LINES:
        raise ProtocolError(431, f"more than {MAX_HEADER_LINES} header lines")
    if len(block) - len(request_line) > MAX_HEADER_BYTES:
        raise ProtocolError(431, f"more than {MAX_HEADER_BYTES} bytes of header lines")
    if _WELL_FORMED.match(block) is None:
        return parse_each_line(request_line, lines)  # a rule is broken: says which
    return parse_well_formed(request_line, lines)


def parse_well_formed(request_line: bytes, lines: List[bytes]) -> RequestHead:
    """``parse_each_line`` for a head ``_WELL_FORMED`` matched: no line checked again (~6% of a hot read)."""
    method, target, version = request_line.decode("ascii").split(" ")
    if version[5] != "1":
        raise ProtocolError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    headers = RequestHeaders()
    for line in lines:
        name, _, value = line.partition(b":")
        headers.add_sent(name.decode("ascii"), value.strip(b" \t").decode("latin-1"))
    return _head(method, target, "HTTP/1.0" if version[7] == "0" else "HTTP/1.1", headers)


def parse_each_line(request_line: bytes, lines: List[bytes]) -> RequestHead:
    """The request line and each header line checked on its own; raises saying which rule one breaks."""
    method, target, version = _request_line(request_line)
    return _head(method, target, version, _headers(lines))


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
    match = _REQUEST_LINE.match(line)
    if not match:
        raise ProtocolError(400, "malformed request line")
    method, target, major, minor = match.groups()
    if major != b"1":
        raise ProtocolError(505, "only HTTP/1.0 and HTTP/1.1 are served")
    version = "HTTP/1.1" if minor != b"0" else "HTTP/1.0"
    return method.decode("ascii"), target.decode("ascii"), version


def _headers(lines: List[bytes]) -> HTTPHeaders:
    headers = RequestHeaders()
    for line in lines:
        name, colon, value = line.partition(b":")
        # No colon, a space before it, or a folded continuation line: refused.
        if not colon or not _TOKEN.match(name):
            raise ProtocolError(400, "malformed header line")
        value = value.strip(b" \t")
        if _FORBIDDEN_IN_VALUE.search(value):
            raise ProtocolError(400, "control character in a header value")
        headers.add_sent(name.decode("ascii"), value.decode("latin-1"))
    return headers


class RequestHeaders(HTTPHeaders):
    """Cyclone's headers, filled without growing Cyclone's cache of header names.

    ``HTTPHeaders.add`` puts every name it is given, normalized, into a
    dictionary of its class, and keeps it for good: a client that made up
    names would grow every worker's memory without end (100 names of 16
    characters per request: 100,000 entries after 1,000 requests). Names a
    client sent are normalized here, into a cache that holds at most
    ``MAX_KNOWN_NAMES`` short names; lookups by the server's own names go
    through Cyclone's as before.
    """

    def add_sent(self, name: str, value: str) -> None:
        """``add`` for a name the client sent."""
        key = normal_name(name)
        self._last_key = key
        if dict.__contains__(self, key):
            dict.__setitem__(self, key, dict.__getitem__(self, key) + "," + value)
            self._as_list[key].append(value)
        else:
            dict.__setitem__(self, key, value)
            self._as_list[key] = [value]


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
    if not headers.get_list("Content-Length"):
        return None
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
