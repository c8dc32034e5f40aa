"""The access log line of a finished request, with secrets redacted.

Tokens never reach the log: the Authorization header is not logged at all,
and anything shaped like a Jetway token in the request target (a client
that put one in a query string) is replaced before the line is written.
"""

from __future__ import annotations

import re
from typing import Any

from twisted.python import log

_TOKEN = re.compile(r"jw_[A-Za-z0-9_-]{20,}")


def redact(text: str) -> str:
    return _TOKEN.sub("jw_[redacted]", text)


def log_request(handler: Any) -> None:
    """Cyclone's ``log_function``: one line per request."""
    request = handler.request
    elapsed_ms = 1000.0 * request.request_time()
    log.msg(
        f"[http] {handler.get_status()} {request.method} {redact(request.uri)} ({request.remote_ip}) {elapsed_ms:.2f}ms"
    )


def no_access_log(handler: Any) -> None:
    """Cyclone's ``log_function`` when access logging is switched off."""
