"""The SDK's side (``api.tracing``): a request's span and its Redis children, their bound, and spans lost counted."""

from __future__ import annotations

import re
import threading
from typing import Any, List

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from twisted.internet.task import Clock

from api.tracing import (
    FLUSH_EVERY,
    MAX_REDIS_SPANS,
    CountingExporter,
    LossMeterProvider,
    RequestTrace,
    SpanLosses,
    SpanRecorder,
    UnrecordedIds,
)
from handlers.http.auth import Grant
from handlers.operations import OPERATIONS


class Recorded:
    """A recorder on a test clock, its spans kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.clock = Clock()
        resource = Resource.create({"service.name": "jetway"})
        self.recorder = SpanRecorder(SimpleSpanProcessor(self.exporter), resource, self.clock)

    def spans(self) -> Any:
        """What reached the processor once a tick passed."""
        self.clock.advance(FLUSH_EVERY)
        return self.exporter.get_finished_spans()


def request_trace() -> Any:
    recorded = Recorded()
    operation = next(op for op in OPERATIONS if op.operation_id == "putDocument")
    trace = RequestTrace(recorded.recorder, "PUT /v1/{collection}/{id}", {}, None, operation)
    return trace, recorded


class Record:
    name = "billing"


def test_a_request_ends_with_its_operation_collection_and_token_name():
    trace, recorded = request_trace()
    trace.redis_call("EVALSHA put", 1, 2, None, {"db.system.name": "redis"})
    trace.finish(201, ("users", "u1"), Grant(Record()))  # type: ignore[arg-type]
    assert recorded.exporter.get_finished_spans() == ()  # made off the request path, once a tick
    child, root = recorded.spans()
    assert child.parent.span_id == root.context.span_id and child.kind == SpanKind.CLIENT
    assert (child.start_time, child.end_time) == (1, 2)
    assert dict(root.attributes) == {
        "http.response.status_code": 201,
        "jetway.operation": "putDocument",
        "jetway.collection": "users",
        "jetway.token.name": "billing",
    }
    assert trace.traceparent == f"00-{trace.trace_id}-{root.context.span_id:016x}-01"
    assert root.kind == SpanKind.SERVER and root.parent is None and root.resource.attributes["service.name"] == "jetway"


def test_a_5xx_and_a_failed_call_are_errors():
    trace, recorded = request_trace()
    trace.redis_call("GET", 1, 2, ConnectionError("down"), {})
    trace.finish(503, (), None)
    child, root = recorded.spans()
    assert child.status.status_code == StatusCode.ERROR and child.attributes["error.type"] == "ConnectionError"
    assert root.status.status_code == StatusCode.ERROR and root.attributes["error.type"] == "503"


def test_redis_spans_are_bounded_and_none_after_the_end():
    trace, recorded = request_trace()
    for _ in range(MAX_REDIS_SPANS + 10):
        trace.redis_call("XREAD", 1, 2, None, {})
    trace.finish(200, (), None)
    trace.redis_call("XREAD", 3, 4, None, {})  # a loop the request started, still running
    trace.finish(200, (), None)  # a second end: nothing more
    spans = recorded.spans()
    assert len(spans) == MAX_REDIS_SPANS + 1
    assert spans[-1].attributes["jetway.redis_spans_dropped"] == 10


def test_a_request_not_sampled_records_nothing_but_carries_its_trace_on():
    trace = UnrecordedIds().new()
    trace.redis_call("GET", 1, 2, None, {})
    trace.finish(200, (), None)
    assert not trace.recording
    assert trace.traceparent == f"00-{trace.trace_id}-{trace.traceparent[36:52]}-00"


def test_the_ids_of_requests_not_sampled_are_valid_and_distinct():
    """W3C's form (lowercase hex, never all zero), at the counter's first value and past many."""
    ids = UnrecordedIds()
    traces = [ids.new() for _ in range(20_000)] + [ids.within(0xABC)]
    for trace in traces[:3] + traces[-3:]:
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", trace.traceparent), trace.traceparent
        assert trace.traceparent[3:35] == trace.trace_id and int(trace.traceparent[36:52], 16) != 0
    assert traces[-1].trace_id == f"{0xABC:032x}"
    assert len({trace.trace_id for trace in traces[:-1]}) == len({t.traceparent for t in traces}) - 1 == 20_000


class Stuck(SpanExporter):
    """A collector that does not answer: the first export waits until the test lets it go."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.go.wait(10)
        return SpanExportResult.SUCCESS


def test_a_full_queue_drops_and_counts():
    """The batch processor's queue holds 2: of 10 spans, 2 wait in the stuck export and 2 in the queue at most."""
    losses, stuck = SpanLosses(), Stuck()
    processor = BatchSpanProcessor(
        stuck, max_queue_size=2, max_export_batch_size=2, meter_provider=LossMeterProvider(losses)
    )
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    for _ in range(10):
        tracer.start_span("s").end()
    try:
        assert losses.taken()["queue_full"] >= 6
        assert losses.taken() == {}  # taken once
    finally:
        stuck.go.set()
        processor.shutdown()


class Refusing(SpanExporter):
    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def export(self, spans: Any) -> SpanExportResult:
        if self.raises:
            raise OSError("connection refused")
        return SpanExportResult.FAILURE


def test_a_batch_the_collector_did_not_take_is_counted():
    losses = SpanLosses()
    spans: List[Any] = [object(), object()]
    assert CountingExporter(Refusing(False), losses).export(spans) is SpanExportResult.FAILURE
    assert CountingExporter(Refusing(True), losses).export(spans) is SpanExportResult.FAILURE
    assert losses.taken() == {"export_failed": 4}
