"""api.logs: the access line formatted by hand is the line ``json_line`` makes."""

from __future__ import annotations

import io
import json

import pytest
from twisted.internet import task

from api.logs import AccessLog, json_line

CASES = [
    ("GET", "/v1/users/u1", 200, "127.0.0.1", 0.42, "0123456789abcdef0123456789abcdef"),
    ("PUT", '/v1/a/b?q="x"\\y', 201, "::1", 12.0, ""),
    ("DELETE", "/v1/a/b", 204, "unix", 3.5, "req-1.2:3"),
    ("GET", "/healthz", 404, "10.0.0.1", 1e-05, "r"),
]


@pytest.mark.parametrize("when", [1_700_000_000.0, 1_700_000_000.6095, 1_700_000_001.25])
@pytest.mark.parametrize(("method", "path", "status", "client", "duration_ms", "request_id"), CASES)
def test_an_access_line_is_what_json_line_makes(when, method, path, status, client, duration_ms, request_id):
    clock = task.Clock()
    clock.advance(when)
    stream = io.StringIO()
    log = AccessLog(stream, True, clock)
    log.request(method, path, status, client, duration_ms, request_id)
    log.flush()
    fields = {"request_id": request_id} if request_id else {}
    fields.update(method=method, path=path, status=status, client=client, duration_ms=duration_ms)
    message = f"{method} {path} {status} ({client}) {duration_ms}ms"
    expected = json_line(when, "info", AccessLog.NAMESPACE, message, fields)
    assert stream.getvalue() == expected
    assert json.loads(stream.getvalue())["path"] == path
