"""Traces over OTLP/HTTP with the OpenTelemetry SDK: a span per request, a child per Redis round trip.

Imported only when ``JETWAY_TRACING_ENDPOINT`` is set (``api.app``): with
tracing off no module of the SDK is loaded and a request pays one attribute
check (the application's ``tracing``). docs/tracing.md says what each span
and attribute means and what tracing costs.

- A request's parent comes from its W3C ``traceparent``/``tracestate``
  (the SDK's propagator: an invalid one is ignored and the request starts a
  trace of its own); sampling is parent-based, a new trace sampled at
  ``JETWAY_TRACING_SAMPLE``.
- Spans leave through the SDK's ``BatchSpanProcessor``: a bounded queue
  emptied by its own thread, so the reactor never waits for a collector. A
  span that finds the queue full, or whose batch the collector did not take,
  is counted (``SpanLosses``, ``jetway_trace_spans_dropped_total``) and lost.
- The spans of a request's Redis calls are recorded when each is answered,
  under the request's span (``cache.trace_scope`` says how the request is
  known there).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import threading
from typing import Any, Dict, Mapping, Optional, Sequence

from opentelemetry import trace as trace_api
from opentelemetry.metrics import NoOpCounter, NoOpMeter, NoOpMeterProvider
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from api.otlp_export import OtlpHttpExporter

# Seconds one export may take; it runs on the processor's thread.
EXPORT_TIMEOUT = 5.0
# Seconds a stopping worker gives its queued spans to leave.
FLUSH_ON_STOP = 2.0
# Redis spans one request records at most: a change-feed stream lives for hours, and a loop a request started
# (a lazily opened subscription) keeps its context; past this, and after its span ended, calls are only counted.
MAX_REDIS_SPANS = 256
# What the SDK counts spans its batch processor handled in (semantic conventions, "otel.sdk.processor.span.processed").
_PROCESSED = "otel.sdk.processor.span.processed"


class SpanLosses:
    """Spans lost since the worker started, by why: ``queue_full`` (the batch queue), ``export_failed`` (the
    collector did not take them). Counted on the reactor's thread and the exporter's, read at each metrics flush."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lost: Dict[str, int] = {}

    def add(self, reason: str, spans: int) -> None:
        with self._lock:
            self.lost[reason] = self.lost.get(reason, 0) + spans

    def taken(self) -> Dict[str, int]:
        """The losses counted since the last call."""
        with self._lock:
            lost, self.lost = self.lost, {}
        return lost


class _DropCounter(NoOpCounter):
    def __init__(self, losses: SpanLosses) -> None:
        super().__init__(_PROCESSED)
        self._losses = losses

    def add(self, amount: Any, attributes: Any = None, context: Any = None) -> None:
        # The processor adds every span it handled; those it dropped carry error.type "queue_full".
        if attributes and attributes.get("error.type") == "queue_full":
            self._losses.add("queue_full", int(amount))


class _LossMeter(NoOpMeter):
    def __init__(self, losses: SpanLosses) -> None:
        super().__init__("jetway")
        self._losses = losses

    def create_counter(self, name: str, unit: str = "", description: str = "") -> Any:
        return _DropCounter(self._losses) if name == _PROCESSED else super().create_counter(name, unit, description)


class LossMeterProvider(NoOpMeterProvider):
    """The meter the batch processor reports to (its public ``meter_provider``): only its drops are kept."""

    def __init__(self, losses: SpanLosses) -> None:
        self._losses = losses

    def get_meter(self, name: str, version: Any = None, schema_url: Any = None, attributes: Any = None) -> Any:
        return _LossMeter(self._losses)


class CountingExporter(SpanExporter):
    """The OTLP exporter, its failed batches counted (it reports a failure; the processor does not count it)."""

    def __init__(self, exporter: SpanExporter, losses: SpanLosses) -> None:
        self._exporter = exporter
        self._losses = losses

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self._exporter.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._losses.add("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class _HeaderGetter(Getter):
    """Cyclone's request headers as the propagator reads them (repeated lines come joined by commas)."""

    def get(self, carrier: Any, key: str) -> Optional[Sequence[str]]:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: Any) -> Sequence[str]:
        return list(carrier.keys())


_HEADERS = _HeaderGetter()


class RequestTrace:
    """One request's span: begun when its head is read, ended when it is answered.

    ``recording``: it was sampled; only then is it made active for the
    request's Redis calls (``cache.trace_scope``). ``traceparent``: what the
    response carries; ``trace_id``: what the access line and problem details
    carry.
    """

    __slots__ = ("_context", "_operation", "_tracer", "recording", "redis_spans", "span", "trace_id", "traceparent")

    def __init__(self, tracer: Any, span: Any, operation: Any) -> None:
        self._tracer = tracer
        self._operation = operation
        self.span = span
        context = span.get_span_context()
        self.recording = span.is_recording()
        self.trace_id = f"{context.trace_id:032x}"
        self.traceparent = f"00-{self.trace_id}-{context.span_id:016x}-{int(context.trace_flags):02x}"
        self._context = trace_api.set_span_in_context(span) if self.recording else None
        self.redis_spans = 0  # Redis calls made under it, recorded or not (MAX_REDIS_SPANS)

    def redis_call(
        self, name: str, started_ns: int, ended_ns: int, error: Optional[BaseException], attributes: Mapping[str, Any]
    ) -> None:
        """A Redis round trip of this request, as a child span (``cache.redis.metered``)."""
        self.redis_spans += 1
        if self._context is None or self.redis_spans > MAX_REDIS_SPANS:
            return  # not sampled, ended, or past the bound
        span = self._tracer.start_span(
            name, self._context, SpanKind.CLIENT, attributes, start_time=started_ns, record_exception=False
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.set_attribute("error.type", type(error).__name__)
        span.end(ended_ns)

    def finish(self, status: int, args: Sequence[Any], grant: Any) -> None:
        """The request answered ``status``: its operation's name, its collection (``args``: the path's) and its
        token's name (never the token; ``grant``: a ``handlers.http.auth.Grant``) set, and its span ended; a
        5xx marks it failed."""
        span, operation = self.span, self._operation
        if self.recording:
            span.set_attribute("http.response.status_code", status)
            if operation is not None:
                span.set_attribute("jetway.operation", operation.operation_id)
                template = operation.path
                if args and template.find("{") == template.find("{collection}") >= 0:  # the path's first argument
                    span.set_attribute("jetway.collection", str(args[0]))
            record = getattr(grant, "record", None)
            if record is not None:
                span.set_attribute("jetway.token.name", record.name)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
                span.set_attribute("error.type", str(status))
            if self.redis_spans > MAX_REDIS_SPANS:
                span.set_attribute("jetway.redis_spans_dropped", self.redis_spans - MAX_REDIS_SPANS)
        self._context = None  # calls after the end (a loop the request started) record nothing
        span.end()


class UnrecordedTrace:
    """A request that is not sampled: its trace goes on (``traceparent``, flag 00), with no SDK span at all.

    The SDK's own unsampled span (the propagator, the sampler, the span) cost
    many times more on PyPy, on nearly every request at a low ratio
    (docs/tracing.md, "How a request's trace follows it").
    """

    __slots__ = ("trace_id", "traceparent")
    recording = False

    def __init__(self, trace_id: str, span_id: str) -> None:
        self.trace_id = trace_id
        self.traceparent = f"00-{trace_id}-{span_id}-00"

    def redis_call(
        self, name: str, started_ns: int, ended_ns: int, error: Optional[BaseException], attributes: Mapping[str, Any]
    ) -> None:
        pass

    def finish(self, status: int, args: Sequence[Any], grant: Any) -> None:
        pass


class UnrecordedIds:
    """Ids for requests not sampled: a random prefix per worker, then counted, as request ids are.

    W3C asks a trace id to be unique; only with the ``random`` flag (not
    set here) must it be random. Two random numbers formatted per request
    cost several times what a count does on PyPy, on nearly every request.
    """

    def __init__(self) -> None:
        self._trace_prefix = os.urandom(8).hex()
        self._span_prefix = (os.urandom(3) + b"\x01").hex()  # never all zero (W3C: an all-zero id is invalid)
        self._count = itertools.count(1)

    def new(self) -> UnrecordedTrace:
        counted = f"{next(self._count):016x}"
        return UnrecordedTrace(self._trace_prefix + counted, self._span_prefix + counted[8:])

    def within(self, trace_id: int) -> UnrecordedTrace:
        """Under a parent's trace that is not sampled."""
        counted = f"{next(self._count):016x}"
        return UnrecordedTrace(f"{trace_id:032x}", self._span_prefix + counted[8:])


class Tracing:
    """A worker's tracer: where its spans go, how many are sampled, and what is lost.

    Sampling is parent-based: a request with a valid ``traceparent`` follows
    its sampled flag; one without is sampled at ``sample``. Both decisions are
    made here, before the SDK is asked for anything, so that a request not
    sampled costs a header lookup and a random number (``UnrecordedTrace``).
    """

    def __init__(self, endpoint: str, sample: float, service: str, losses: SpanLosses, reactor: Any) -> None:
        self.losses = losses
        self._reactor = reactor
        resource = Resource.create(
            {"service.name": service, "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
        )
        # shutdown_on_exit off: the worker flushes for a bounded time as it stops (close), not at exit.
        self._sample = sample
        self._unrecorded = UnrecordedIds()
        # What reaches the SDK is sampled already (begin): a new trace, or a sampled parent's.
        self._provider = TracerProvider(sampler=ParentBased(ALWAYS_ON), resource=resource, shutdown_on_exit=False)
        exporter = OtlpHttpExporter(endpoint.rstrip("/") + "/v1/traces", EXPORT_TIMEOUT)
        self._processor = BatchSpanProcessor(
            CountingExporter(exporter, losses), meter_provider=LossMeterProvider(losses)
        )
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("jetway")
        self._propagator = TraceContextTextMapPropagator()
        reactor.addSystemEventTrigger("before", "shutdown", self.close)

    def begin(self, method: str, route: str, path: str, headers: Any, request_id: str, operation: Any) -> Any:
        """A request's span (a ``RequestTrace``, or an ``UnrecordedTrace`` when not sampled), its parent the
        request's ``traceparent`` if valid (``route``: its path template; ``operation``: its
        ``handlers.operation.Operation``, None when it has none)."""
        parent = None
        # The stored name, past Cyclone's get (which normalizes the name it is given, on every request).
        if dict.get(headers, "Traceparent") is not None:
            parent = self._propagator.extract(headers, getter=_HEADERS)
            given = trace_api.get_current_span(parent).get_span_context()
            if given.is_valid and not given.trace_flags.sampled:
                return self._unrecorded.within(given.trace_id)
            if not given.is_valid:
                parent = None  # invalid: ignored, a trace of its own (W3C)
        if parent is None and self._sample < 1.0 and random.random() >= self._sample:
            return self._unrecorded.new()
        attributes = {
            "http.request.method": method,
            "http.route": route,
            "url.path": path,
            "jetway.request_id": request_id,
        }
        span = self._tracer.start_span(f"{method} {route}", parent, SpanKind.SERVER, attributes)
        return RequestTrace(self._tracer, span, operation)

    def close(self) -> Any:
        """Send what is queued, for at most ``FLUSH_ON_STOP`` seconds, off the reactor's thread; then stop."""
        from twisted.internet import defer

        done: defer.Deferred = defer.Deferred()

        def flush() -> None:
            self._processor.force_flush()
            self._reactor.callFromThread(lambda: done.called or done.callback(None))

        threading.Thread(target=flush, name="jetway-trace-flush", daemon=True).start()
        timer = self._reactor.callLater(FLUSH_ON_STOP, lambda: done.called or done.callback(None))
        return done.addCallback(lambda _: timer.active() and timer.cancel())
