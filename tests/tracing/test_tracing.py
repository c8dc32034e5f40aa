"""A request's span, its Redis children and their bound (``api.tracing``); spans queued, lost (``api.span_queue``)."""

from __future__ import annotations

import re
import threading
import time
from typing import Any, List

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode
from twisted.internet.task import Clock

from api.config import ConfigError, from_environment
from api.span_queue import SpanLosses, SpanQueue
from api.tracing import FLUSH_EVERY, MAX_REDIS_SPANS, RequestTrace, SpanRecorder, TraceIds
from handlers.http.auth import Grant
from handlers.operations import OPERATIONS


class Kept:
    """A span queue that keeps what it is given."""

    def __init__(self) -> None:
        self.spans: List[Any] = []

    def add(self, spans: List[Any]) -> None:
        self.spans += spans


class Recorded:
    """A recorder on a test clock, its spans kept in memory."""

    def __init__(self, room: int = 4096) -> None:
        self.queue = Kept()
        self.clock = Clock()
        self.losses = SpanLosses()
        self.ids = TraceIds()
        resource = Resource.create({"service.name": "jetway"})
        self.recorder = SpanRecorder(self.queue, resource, self.clock, self.losses, room=room)

    def trace(self, sampled: int = 1, path: str = "/v1/users/u1") -> RequestTrace:
        """A PUT's trace, begun now."""
        operation = next(op for op in OPERATIONS if op.operation_id == "putDocument")
        ids = (*self.ids.new(), sampled)
        return RequestTrace(self.recorder, ids, None, "PUT", "/v1/{collection}/{id}", path, "r1", operation)

    def spans(self) -> Any:
        """What reached the queue once a tick passed."""
        self.clock.advance(FLUSH_EVERY)
        return tuple(self.queue.spans)


def request_trace() -> Any:
    recorded = Recorded()
    return recorded.trace(), recorded


class Record:
    name = "billing"


def test_a_request_ends_with_its_operation_collection_and_token_name():
    trace, recorded = request_trace()
    trace.redis_call("EVALSHA put", 1, 2, None, {"db.system.name": "redis"})
    trace.finish(201, ("users", "u1"), Grant(Record()))  # type: ignore[arg-type]
    assert recorded.queue.spans == []  # made off the request path, once a tick
    child, root = recorded.spans()
    assert child.parent.span_id == root.context.span_id and child.kind == SpanKind.CLIENT
    assert (child.start_time, child.end_time) == (1, 2)
    assert root.name == "PUT /v1/{collection}/{id}"
    assert dict(root.attributes) == {
        "http.request.method": "PUT",
        "http.route": "/v1/{collection}/{id}",
        "url.path": "/v1/users/u1",
        "jetway.request_id": "r1",
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
    recorded = Recorded()
    kept, dropped, kept_too = recorded.trace(1, "/v1/a/1"), recorded.trace(0, "/v1/a/2"), recorded.trace(1, "/v1/a/3")
    for trace in (kept, dropped, kept_too):
        trace.finish(200, (), None)
    assert dropped.traceparent == f"00-{dropped.trace_id}-{dropped.span_id}-00" and not dropped.recording
    assert kept.traceparent == f"00-{kept.trace_id}-{kept.span_id}-01"
    assert [span.attributes["url.path"] for span in recorded.spans()] == ["/v1/a/1", "/v1/a/3"]
    recorded.trace(0).finish(200, (), None)
    assert len(recorded.spans()) == 2  # nothing more on the next tick


def test_a_tick_past_the_rings_room_keeps_the_newest_and_counts_the_rest():
    recorded = Recorded(room=8)
    for number in range(12):
        trace = recorded.trace(1, f"/v1/a/{number}")
        trace.finish(200, (), None)
        recorded.trace(0).finish(200, (), None)  # overwritten by the next
    paths = [span.attributes["url.path"] for span in recorded.spans()]
    assert paths == [f"/v1/a/{number}" for number in range(5, 12)]  # the ring keeps one slot for the next
    assert recorded.losses.taken() == {"queue_full": 5}
    recorded.trace(1, "/v1/a/last").finish(200, (), None)
    assert recorded.spans()[-1].attributes["url.path"] == "/v1/a/last"
    assert recorded.losses.taken() == {}


def test_the_ids_are_valid_distinct_and_carry_the_sampled_flag():
    """W3C's form (lowercase hex, never all zero), at the counter's first value and past many."""
    recorded = Recorded()
    traces = [recorded.trace(number % 2) for number in range(20_000)]
    for trace in traces[:3] + traces[-3:]:
        flag = "01" if trace.recording else "00"
        assert re.fullmatch(rf"00-[0-9a-f]{{32}}-[0-9a-f]{{16}}-{flag}", trace.traceparent), trace.traceparent
        assert trace.traceparent[3:35] == trace.trace_id and int(trace.traceparent[36:52], 16) != 0
    assert len({trace.trace_id for trace in traces}) == len({trace.span_id for trace in traces}) == 20_000
    other = Recorded().trace()
    assert other.trace_id[:16] != traces[0].trace_id[:16] and other.span_id[:6] != traces[0].span_id[:6]


class Stuck(SpanExporter):
    """A collector that does not answer: each export waits until the test lets it go."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.exported: List[int] = []
        self.closed = False

    def export(self, spans: Any) -> SpanExportResult:
        self.exported.append(len(spans))
        self.go.wait(10)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.closed = True


def wait_for(done: Any) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "not done in 10 s"
        time.sleep(0.01)


def test_a_full_queue_drops_and_counts_and_what_it_held_is_sent_as_it_stops():
    """The queue holds 4 and sends 2 at a time: while the collector is stuck on the first batch, the queue fills."""
    losses, stuck = SpanLosses(), Stuck()
    queue = SpanQueue(stuck, losses, max_queue=4, max_batch=2, every=60)
    try:
        queue.add([object(), object()])  # a full batch: sent at once, without waiting the minute
        wait_for(lambda: stuck.exported == [2])
        queue.add([object()] * 7)
        assert losses.taken() == {"queue_full": 3}
        assert losses.taken() == {}  # taken once
    finally:
        stuck.go.set()
        queue.stop(10)
    assert stuck.exported == [2, 2, 2] and stuck.closed  # the 4 queued, sent before the exporter closed


def test_a_batch_waits_at_most_every_seconds():
    losses, stuck = SpanLosses(), Stuck()
    stuck.go.set()
    queue = SpanQueue(stuck, losses, max_queue=2048, max_batch=512, every=0.05)
    try:
        queue.add([object()])
        wait_for(lambda: stuck.exported == [1])
    finally:
        queue.stop(10)


class Refusing(SpanExporter):
    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def export(self, spans: Any) -> SpanExportResult:
        if self.raises:
            raise OSError("connection refused")
        return SpanExportResult.FAILURE


def test_a_batch_the_collector_did_not_take_is_counted():
    for raises in (False, True):
        losses = SpanLosses()
        queue = SpanQueue(Refusing(raises), losses, max_queue=2048, max_batch=512, every=60)
        queue.add([object(), object()])
        queue.stop(10)
        assert losses.taken() == {"export_failed": 2}


def test_the_queue_takes_the_sdks_batch_variables():
    def queue_of(environ: Any) -> Any:
        settings = from_environment(environ)
        return settings.tracing_queue, settings.tracing_batch, settings.tracing_delay_ms

    assert queue_of({}) == (2048, 512, 5000)
    environ = {
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "500",
        "OTEL_BSP_SCHEDULE_DELAY": "250",
    }
    assert queue_of(environ) == (100, 100, 250)  # a batch within the queue
    for name, text in (("OTEL_BSP_MAX_QUEUE_SIZE", "-1"), ("OTEL_BSP_SCHEDULE_DELAY", "soon")):
        with pytest.raises(ConfigError, match=name):  # refused at the start, as every setting is
            from_environment({name: text})
