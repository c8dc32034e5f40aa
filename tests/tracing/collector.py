"""An OTLP/HTTP trace receiver in the test process: what a collector (Jaeger, the OpenTelemetry Collector) gets.

It accepts ``POST /v1/traces`` (protobuf, maybe gzipped), decodes each
``ExportTraceServiceRequest`` with opentelemetry-proto and keeps its spans
as plain ``Span`` records the tests read. Stopped by the test that started it.
"""

from __future__ import annotations

import gzip
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
    """The receiver on a free port of 127.0.0.1; ``endpoint`` is what ``JETWAY_TRACING_ENDPOINT`` takes."""

    def __init__(self) -> None:
        self.spans: List[Span] = []
        self.posts = 0
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                collector.receive(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

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
