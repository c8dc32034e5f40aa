"""An OTLP/HTTP trace receiver in the test process: what a collector (Jaeger, the OpenTelemetry Collector) gets.

It accepts ``POST /v1/traces`` (protobuf, maybe gzipped), decodes each
``ExportTraceServiceRequest`` with opentelemetry-proto and keeps its spans
as plain ``Span`` records the tests read. Stopped by the test that started it.
"""

from __future__ import annotations

import gzip
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int  # 2: server, 3: client (opentelemetry-proto's Span.SpanKind)
    attributes: Dict[str, Any]
    status_code: int  # 2: error
    service: str
    start_ns: int
    end_ns: int
    children: List[Span] = field(default_factory=list)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Collector:
    """The receiver on a free port of 127.0.0.1; ``endpoint`` is what ``JETWAY_TRACING_ENDPOINT`` takes.

    It speaks HTTP/1.1, keeping connections as a real collector does, and counts what it got: ``posts``
    (batches taken), ``requests`` (every POST), ``connections`` and each POST's ``authorizations``.
    Misbehaving on request: ``hang_up``, it closes each connection after its answer without saying so
    (a collector's idle timeout between two batches); ``status``, what it answers; ``stall``, seconds it
    waits before answering each POST after the first; ``endless``, its first answer's body never ends;
    ``tls``, a ``ssl.SSLContext`` it serves with.
    """

    def __init__(
        self,
        hang_up: bool = False,
        status: int = 200,
        stall: float = 0.0,
        endless: bool = False,
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        self.spans: List[Span] = []
        self.posts = 0
        self.requests = 0
        self.connections = 0
        self.authorizations: List[str] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                collector.connections += 1
                super().setup()

            def do_POST(self) -> None:
                collector.requests += 1
                collector.authorizations.append(self.headers.get("Authorization", ""))
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self._answer(404)
                    return
                if collector.requests > 1:
                    time.sleep(stall)
                if status != 200:
                    self._answer(status)
                    return
                collector.receive(ExportTraceServiceRequest.FromString(body))
                if endless and collector.requests == 1:
                    self._answer_without_end()
                    return
                self._answer(200, ExportTraceServiceResponse().SerializeToString())
                self.close_connection = hang_up

            def _answer(self, code: int, answer: bytes = b"") -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def _answer_without_end(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 40))
                self.end_headers()
                self.close_connection = True
                try:
                    while True:
                        self.wfile.write(bytes(1 << 16))
                except OSError:  # the exporter closed the connection
                    return

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def receive(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        Span(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.kind,
                            {kv.key: _value(kv.value) for kv in span.attributes},
                            span.status.code,
                            resource.get("service.name", ""),
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.spans.extend(spans)
            self.posts += 1

    def trace(self, trace_id: str) -> List[Span]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(self, test: Callable[[], Any], timeout: float = 20.0) -> Any:
        """``test()``'s first true value, polled while the workers' batches arrive."""
        deadline = time.monotonic() + timeout
        while True:
            found = test()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"not received in {timeout} s; spans so far: {[s.name for s in self.spans]}")
            time.sleep(0.05)


def tree(spans: List[Span]) -> Optional[Span]:
    """The trace's root (the span whose parent is not among them), its children filled in, in start order."""
    by_id = {span.span_id: span for span in spans}
    root = None
    for span in sorted(spans, key=lambda s: s.start_ns):
        span.children = []
    for span in sorted(spans, key=lambda s: s.start_ns):
        parent = by_id.get(span.parent_span_id)
        if parent is None:
            root = span
        else:
            parent.children.append(span)
    return root


def render(span: Span, depth: int = 0) -> str:
    """The span tree as text, each span with its attributes: what the README's trace shows."""
    status = " ERROR" if span.status_code == 2 else ""
    micros = (span.end_ns - span.start_ns) // 1000
    line = f"{'  ' * depth}{span.name} [{micros} µs]{status} {span.attributes}\n"
    return line + "".join(render(child, depth + 1) for child in span.children)
