"""CORS: which browser origins may call the API, and the headers that tell the browser so.

The operator lists the origins (``JETWAY_CORS_ORIGINS``; none by default,
so a browser page on another origin reads nothing). A response to an
allowed origin carries ``Access-Control-Allow-Origin`` and the headers a
page may read (``EXPOSED``), whatever its status: a browser turns a
response without them, a 304 or a problem document included, into an
opaque network error. Preflight ``OPTIONS`` requests are answered before
authorization (a browser never sends credentials with them). The headers
for each origin are made once, also as the bytes of a response head
(``response_lines``), which a handler appends as they are: Cyclone's
``add_header`` checks every value with a regular expression and encodes
each line, per response (docs/performance.md, "CORS: an allowed `Origin`", has
the measurements). A request without
``Origin`` costs one dictionary lookup, and nothing at all when no
origin is allowed.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

Headers = List[Tuple[str, str]]

# What a page may send beyond the CORS-safelisted request headers.
ALLOWED_HEADERS = (
    "Authorization",
    "Content-Type",
    "If-Match",
    "If-None-Match",
    "If-Modified-Since",
    "If-Unmodified-Since",
    "Idempotency-Key",
    "Last-Event-ID",
    "Cache-Control",
    "X-Request-ID",
)
# What a page may read beyond the CORS-safelisted response headers
# (Cache-Control, Content-Language, Content-Length, Content-Type, Expires,
# Last-Modified, Pragma are readable already).
EXPOSED_HEADERS = (
    "ETag",
    "Location",
    "Retry-After",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "X-Request-ID",
    "Idempotency-Replayed",
    "Content-Encoding",
)
# How long a browser may keep a preflight's answer (Chromium caps it at 2 h).
MAX_AGE_SECONDS = 600
ANY_ORIGIN = "*"


class CorsPolicy:
    """The allowed origins (``*`` for any), and the headers for each."""

    def __init__(self, origins: Sequence[str]) -> None:
        self.enabled = bool(origins)
        self._any = ANY_ORIGIN in origins
        self._origins = frozenset(origins)
        self._made: Dict[str, Headers] = {}
        self._lines: Dict[Optional[str], bytes] = {}

    def allows(self, origin: Optional[str]) -> bool:
        return origin is not None and (self._any or origin in self._origins)

    def response_headers(self, origin: Optional[str]) -> Headers:
        """The CORS headers of any response to ``origin`` (none if it is not allowed)."""
        if not self.enabled:
            return []
        if not self.allows(origin):
            # Still say that the answer depends on Origin, so a cache does
            # not hand this response to an allowed origin's page.
            return [] if self._any else [("Vary", "Origin")]
        assert origin is not None
        # With any origin allowed the headers are the same for all: one entry,
        # not one per Origin a client makes up.
        key = ANY_ORIGIN if self._any else origin
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = self._headers_for(origin)
        return made

    def response_lines(self, origin: Optional[str]) -> bytes:
        """``response_headers(origin)`` as header lines, each ending in CRLF (b"" for none)."""
        # One entry per allowed origin (one for all with ``*``); no Origin and
        # every origin not allowed share the None one.
        listed = origin is None or origin in self._origins
        key = origin if listed else (ANY_ORIGIN if self._any else None)
        lines = self._lines.get(key)
        if lines is None:
            headers = self.response_headers(origin if key is not None else None)
            lines = self._lines[key] = b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in headers)
        return lines

    def preflight_headers(self, origin: Optional[str], methods: Sequence[str]) -> Headers:
        """The headers of a preflight's answer, for a path that supports ``methods``."""
        if not self.allows(origin):
            return self.response_headers(origin)
        return [
            *self.response_headers(origin),
            ("Access-Control-Allow-Methods", ", ".join(methods)),
            ("Access-Control-Allow-Headers", ", ".join(ALLOWED_HEADERS)),
            ("Access-Control-Max-Age", str(MAX_AGE_SECONDS)),
        ]

    def _headers_for(self, origin: str) -> Headers:
        allowed = ANY_ORIGIN if self._any else origin
        headers = [
            ("Access-Control-Allow-Origin", allowed),
            ("Access-Control-Expose-Headers", ", ".join(EXPOSED_HEADERS)),
        ]
        if not self._any:
            headers.append(("Vary", "Origin"))
        return headers


NO_CORS = CorsPolicy(())
