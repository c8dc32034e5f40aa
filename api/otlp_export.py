"""Spans to an OTLP/HTTP collector, encoded by hand in OTLP's protobuf wire format.

The SDK's exporter builds opentelemetry-proto messages, which on PyPy run as
protobuf's pure-Python implementation, many times slower than this (the
figures: docs/tracing.md, "Export, and a collector that is down"), on the
exporter's thread but holding the interpreter's lock, so the reactor
waited for it. This encoder
writes the few fields a Jetway span has straight to bytes; the test
collector decodes them with opentelemetry-proto (tests/tracing/).

One POST per batch, no retry: a batch the collector does not take within
the timeout is dropped and counted by the caller (``api.span_queue.SpanQueue``).
The POST goes over one kept-alive ``http.client`` connection, not
``requests``: on PyPy a ``requests`` POST cost the exporter's thread ten
times the CPU (its proxy lookup, adapters and hooks, each time), all of it
holding the lock the reactor needs (docs/tracing.md, "What it costs"). So
the proxy variables (``HTTPS_PROXY``) are not read: the collector is
reached directly.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import struct
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import unquote, urlsplit

import certifi
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

# Bytes of a collector's answer read (OTLP's is a few bytes, or a status); past them the connection is closed, so
# that a collector that answers without end costs neither memory nor the exporter's thread.
MAX_ANSWER = 1 << 16
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64, as protobuf writes a negative one
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The one-byte varints, and each length-delimited field's tag (wire type 2), made once: on PyPy a bytearray a
# varint was most of a span's encoding, on the exporter's thread but holding the interpreter's lock
# (docs/tracing.md, "What it costs").
_SMALL = [bytes((n,)) for n in range(0x80)]
_TAG = [_varint(number << 3 | 2) for number in range(16)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    length = len(payload)
    return _TAG[number] + (_SMALL[length] if length < 0x80 else _varint(length)) + payload


_TRUE, _FALSE = _varint(2 << 3) + _varint(1), _varint(2 << 3) + _varint(0)
_INT_TAG, _DOUBLE_TAG = _varint(3 << 3), _varint(4 << 3 | 1)


def _any_value(value: Any) -> bytes:
    if value is True or value is False:
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return _field(1, value.encode())
    if isinstance(value, int):
        return _INT_TAG + _varint(value)
    if isinstance(value, float):
        return _DOUBLE_TAG + _DOUBLE.pack(value)
    if isinstance(value, (tuple, list)):  # an ArrayValue (5) of AnyValues (1); the SDK keeps a list as a tuple
        return _field(5, b"".join([_field(1, _any_value(item)) for item in value]))
    return _field(1, str(value).encode())


def _attributes(number: int, attributes: Mapping[str, Any]) -> bytes:
    """Each as a KeyValue (key 1, AnyValue 2) in field ``number``."""
    return b"".join(
        [_field(number, _field(1, key.encode()) + _field(2, _any_value(value))) for key, value in attributes.items()]
    )


_KIND_TAG, _START_TAG, _END_TAG = _varint(6 << 3), _varint(7 << 3 | 1), _varint(8 << 3 | 1)
_STATUS_CODE_TAG = _varint(3 << 3)


def _span(span: Any) -> bytes:
    context = span.context
    parts = [
        _field(1, context.trace_id.to_bytes(16, "big")),
        _field(2, context.span_id.to_bytes(8, "big")),
    ]
    if span.parent is not None:
        parts.append(_field(4, span.parent.span_id.to_bytes(8, "big")))
    parts += (
        _field(5, span.name.encode()),
        _KIND_TAG + _SMALL[span.kind.value + 1],  # the API's INTERNAL is 0, OTLP's 1
        _START_TAG + _FIXED64.pack(span.start_time),
        _END_TAG + _FIXED64.pack(span.end_time),
        _attributes(9, span.attributes or {}),
    )
    status = span.status
    if status.status_code.value:  # UNSET (0) is the default: not written
        message = _field(2, status.description.encode()) if status.description else b""
        parts.append(_field(15, message + _STATUS_CODE_TAG + _SMALL[status.status_code.value]))
    return b"".join(parts)


def encode(spans: Sequence[Any]) -> bytes:
    """An ``ExportTraceServiceRequest``: the spans grouped by resource, then by instrumentation scope.

    Grouped by the objects themselves (a worker has one of each): the SDK's
    ``Resource`` hashes by dumping its attributes to JSON, for every span.
    """
    grouped: List[Tuple[Any, Dict[Tuple[str, str], List[bytes]]]] = []
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = next((held for known, held in grouped if known is resource), None)
        if scopes is None:
            scopes = {}
            grouped.append((resource, scopes))
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        scopes.setdefault(key, []).append(_field(2, _span(span)))
    out = []
    for resource, scopes in grouped:
        body = [_field(1, _attributes(1, resource.attributes))]
        for (name, version), encoded in scopes.items():
            scope = _field(1, name.encode()) + (_field(2, version.encode()) if version else b"")
            body.append(_field(2, _field(1, scope) + b"".join(encoded)))
        out.append(_field(1, b"".join(body)))
    return b"".join(out)


class OtlpHttpExporter(SpanExporter):
    """POSTs each batch to ``<endpoint>/v1/traces`` as ``application/x-protobuf``, over one kept-alive connection."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if secure else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = timeout
        self._post_headers = {"Content-Type": "application/x-protobuf"}
        if parts.username is not None:  # http://user:password@host: basic authentication, as requests sent it
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._post_headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode()
        self._tls: Optional[ssl.SSLContext] = None
        if secure:
            # The system's authorities (and SSL_CERT_FILE), and certifi's bundle, which requests used before.
            self._tls = ssl.create_default_context()
            self._tls.load_verify_locations(certifi.where())
        self._connection: Optional[http.client.HTTPConnection] = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        body = encode(spans)
        # A kept connection the collector closed while idle fails at once: the batch goes once more on a new one.
        # A new connection's failure, or a timeout, is the batch's.
        reused = self._connection is not None
        while True:
            if self._connection is None:
                self._connection = self._connect()
            try:
                self._connection.request("POST", self._path, body=body, headers=self._post_headers)
                answer = self._connection.getresponse()
                answer.read(MAX_ANSWER)
            except (OSError, http.client.HTTPException) as error:
                self._close()
                if reused and not isinstance(error, socket.timeout):
                    reused = False
                    continue
                return SpanExportResult.FAILURE
            if answer.will_close or not answer.isclosed():  # or an answer longer than MAX_ANSWER, left unread
                self._close()
            return SpanExportResult.SUCCESS if 200 <= answer.status < 300 else SpanExportResult.FAILURE

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def shutdown(self) -> None:
        self._close()
