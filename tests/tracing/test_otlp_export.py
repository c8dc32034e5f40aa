"""Spans encoded by hand (``api.otlp_export``) decode to what the SDK's own protobuf encoder makes."""

from __future__ import annotations

from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from api.otlp_export import encode


def without_defaults(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """What the SDK writes and this encoder leaves at its default: an UNSET status, flags, schema URLs."""
    for resource_spans in request.resource_spans:
        resource_spans.ClearField("schema_url")
        for scope_spans in resource_spans.scope_spans:
            scope_spans.ClearField("schema_url")
            for span in scope_spans.spans:
                span.ClearField("flags")
                if span.status.code == 0 and not span.status.message:
                    span.ClearField("status")
    return request


def test_the_encoding_is_the_sdks():
    exported = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "jetway"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("jetway")
    attributes = {"http.route": "/v1/{collection}/{id}", "count": 5, "negative": -3, "ratio": 0.5, "flag": True}
    attributes["jetway.redis.nodes"] = ["10.0.0.1:6379", "10.0.0.2:6379"]  # an array
    request = tracer.start_span("PUT /v1/{collection}/{id}", kind=SpanKind.SERVER, attributes=attributes)
    call = tracer.start_span("EVALSHA put", trace_api.set_span_in_context(request), SpanKind.CLIENT)
    call.set_status(Status(StatusCode.ERROR, "RedisTimeout"))
    call.end()
    request.set_status(Status(StatusCode.ERROR))
    request.end()
    tracer.start_span("internal, unset status").end()
    spans = exported.get_finished_spans()
    mine = ExportTraceServiceRequest.FromString(encode(spans))
    assert without_defaults(mine) == without_defaults(encode_spans(spans))
    assert len(mine.resource_spans[0].scope_spans[0].spans) == 3
