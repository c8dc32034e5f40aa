"""Traces over OTLP/HTTP with the OpenTelemetry SDK: a span per request, a child per Redis round trip.

Imported only when ``JETWAY_TRACING_ENDPOINT`` is set (``api.app``): with
tracing off no module of the SDK is loaded and a request pays one attribute
check (the application's ``tracing``). docs/tracing.md says what each span
and attribute means and what tracing costs.

- A request's parent comes from its W3C ``traceparent``/``tracestate``
  (the SDK's propagator: an invalid one is ignored and the request starts a
  trace of its own); sampling is parent-based, a new trace sampled at
  ``JETWAY_TRACING_SAMPLE``.
- Spans leave through a ``api.span_queue.SpanQueue``: a bounded queue
  emptied by its own thread, so the reactor never waits for a collector. A
  span that finds the queue full, or whose batch the collector did not take,
  is counted (``SpanLosses``, ``jetway_trace_spans_dropped_total``) and lost.
- The spans of a request's Redis calls are recorded when each is answered,
  under the request's span (``cache.trace_scope`` says how the request is
  known there).
- A sampled request gathers plain data while it runs; its spans
  (``FinishedSpan``: the fields of the SDK's ``ReadableSpan`` that the
  export reads) are made from it after it ended, once a tick
  (``SpanRecorder``), and handed to the queue there.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from opentelemetry import trace as trace_api
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from api.config import Settings
from api.counted_ids import CountedIds
from api.otlp_export import OtlpHttpExporter
from api.span_queue import SpanLosses, SpanQueue

# Seconds one export may take; it runs on the queue's thread.
EXPORT_TIMEOUT = 5.0
# Seconds a stopping worker gives its queued spans to leave.
FLUSH_ON_STOP = 2.0
# Seconds between a sampled request's end and its spans' handing to the queue (SpanRecorder).
FLUSH_EVERY = 0.05
# Redis spans one request records at most: a change-feed stream lives for hours, and a loop a request started
# (a lazily opened subscription) keeps its context; past this, and after its span ended, calls are only counted.
MAX_REDIS_SPANS = 256
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status()  # unset, as the SDK leaves a span that ended well


class _HeaderGetter(Getter):
    """Cyclone's request headers as the propagator reads them (repeated lines come joined by commas)."""

    def get(self, carrier: Any, key: str) -> Optional[Sequence[str]]:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: Any) -> Sequence[str]:
        return list(carrier.keys())


_HEADERS = _HeaderGetter()


class RequestTrace:
    """One sampled request's span: begun when its head is read, ended when it is answered.

    While the request runs it only gathers plain data (its attributes, each
    Redis call's name, times and outcome); ``finish`` hands it to the
    ``SpanRecorder``, which makes its spans off the request path. On
    PyPy the SDK's own live spans (a lock each, bounded attributes, the
    sampler, its metrics) made the rare sampled request cost the JIT far
    more than its share (docs/tracing.md, "What it costs").

    ``recording``: always, for this class (``UnrecordedTrace`` is the
    other); only a recording trace is made active for the request's Redis
    calls (``cache.trace_scope``). ``traceparent``: what the response
    carries; ``trace_id``: what the access line and problem details carry.
    """

    __slots__ = (
        "_operation",
        "_recorder",
        "attributes",
        "calls",
        "end_ns",
        "failed",
        "ids",
        "name",
        "parent",
        "recording",
        "redis_spans",
        "start_ns",
        "trace_id",
        "traceparent",
    )

    def __init__(
        self,
        recorder: SpanRecorder,
        name: str,
        attributes: Dict[str, Any],
        parent: Optional[SpanContext],
        operation: Any,
    ) -> None:
        self._recorder = recorder
        self._operation = operation
        self.name = name
        self.attributes = attributes
        self.parent = parent
        # Its span's ids as SpanIds, not the SDK's SpanContext (SpanIds says why).
        self.ids = SpanIds(
            parent.trace_id if parent is not None else _new_id(128),
            _new_id(64),
            parent.trace_state if parent is not None else None,
        )
        self.trace_id = f"{self.ids.trace_id:032x}"
        self.traceparent = f"00-{self.trace_id}-{self.ids.span_id:016x}-01"
        self.recording = True
        self.redis_spans = 0  # Redis calls made under it, kept or not (MAX_REDIS_SPANS)
        self.calls: List[Tuple[str, int, int, Optional[str], Mapping[str, Any]]] = []
        self.failed = False
        self.start_ns = time.time_ns()
        self.end_ns = 0  # set by finish: the span ended

    def redis_call(
        self, name: str, started_ns: int, ended_ns: int, error: Optional[BaseException], attributes: Mapping[str, Any]
    ) -> None:
        """A Redis round trip of this request, kept to become a child span (``cache.redis.metered``)."""
        self.redis_spans += 1
        if self.end_ns or self.redis_spans > MAX_REDIS_SPANS:
            return  # ended (a loop the request started), or past the bound
        self.calls.append((name, started_ns, ended_ns, None if error is None else type(error).__name__, attributes))

    def finish(self, status: int, args: Sequence[Any], grant: Any) -> None:
        """The request answered ``status``: its operation's name, its collection (``args``: the path's) and its
        token's name (never the token; ``grant``: a ``handlers.http.auth.Grant``) set, and its span ended; a
        5xx marks it failed. Once: a second end changes nothing."""
        if self.end_ns:
            return
        attributes, operation = self.attributes, self._operation
        attributes["http.response.status_code"] = status
        if operation is not None:
            attributes["jetway.operation"] = operation.operation_id
            template = operation.path
            if args and template.find("{") == template.find("{collection}") >= 0:  # the path's first argument
                attributes["jetway.collection"] = str(args[0])
        record = getattr(grant, "record", None)
        if record is not None:
            attributes["jetway.token.name"] = record.name
        if status >= 500:
            self.failed = True
            attributes["error.type"] = str(status)
        if self.redis_spans > MAX_REDIS_SPANS:
            attributes["jetway.redis_spans_dropped"] = self.redis_spans - MAX_REDIS_SPANS
        self.end_ns = time.time_ns()
        self._recorder.add(self)

    def spans(self, resource: Resource, scope: InstrumentationScope) -> List[FinishedSpan]:
        """Its Redis calls' spans, then its own, as the exporter encodes them (``SpanRecorder.flush``)."""
        made = []
        own = self.ids
        for name, started_ns, ended_ns, error, attributes in self.calls:
            status = _OK
            if error is not None:
                attributes = {**attributes, "error.type": error}
                status = Status(StatusCode.ERROR, error)
            context = SpanIds(own.trace_id, _new_id(64), own.trace_state)
            made.append(
                FinishedSpan(
                    name, context, own, resource, attributes, SpanKind.CLIENT, status, started_ns, ended_ns, scope
                )
            )
        status = Status(StatusCode.ERROR) if self.failed else _OK
        made.append(
            FinishedSpan(
                self.name,
                own,
                self.parent,
                resource,
                self.attributes,
                SpanKind.SERVER,
                status,
                self.start_ns,
                self.end_ns,
                scope,
            )
        )
        return made


class SpanIds:
    """A span's ids, as the exporter reads the SDK's ``SpanContext``: made without it.

    The SDK's ``SpanContext`` (a ``typing.Tuple`` subclass), made for the
    rare sampled request, slowed every request of a PyPy worker, sampled or
    not (docs/tracing.md, "What it costs").
    """

    __slots__ = ("span_id", "trace_id", "trace_state")
    trace_flags = _SAMPLED
    is_remote = False

    def __init__(self, trace_id: int, span_id: int, trace_state: Any) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.trace_state = trace_state


class FinishedSpan:
    """A finished span: the fields of the SDK's ``ReadableSpan`` that the exporter (``api.otlp_export``)
    reads, made without the SDK's objects (``SpanIds`` says why)."""

    __slots__ = (
        "attributes",
        "context",
        "end_time",
        "instrumentation_scope",
        "kind",
        "name",
        "parent",
        "resource",
        "start_time",
        "status",
    )

    def __init__(
        self,
        name: str,
        context: SpanIds,
        parent: Any,
        resource: Resource,
        attributes: Mapping[str, Any],
        kind: SpanKind,
        status: Status,
        start_time: int,
        end_time: int,
        scope: InstrumentationScope,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.resource = resource
        self.attributes = attributes
        self.kind = kind
        self.status = status
        self.start_time = start_time
        self.end_time = end_time
        self.instrumentation_scope = scope


class SpanRecorder:
    """Finished sampled requests, made into their spans and handed to the span queue once a tick.

    ``add`` is what a request's end costs: an append, and a timer for the
    first of a tick. ``flush`` runs from the reactor, so the spans reach the
    queue in the order the requests ended, on the thread that made them.
    """

    def __init__(self, queue: SpanQueue, resource: Resource, reactor: Any, every: float = FLUSH_EVERY) -> None:
        self._queue = queue
        self._resource = resource
        self._scope = InstrumentationScope("jetway")
        self._reactor = reactor
        self._every = every
        self._ended_traces: List[RequestTrace] = []

    def add(self, trace: RequestTrace) -> None:
        if not self._ended_traces:
            self._reactor.callLater(self._every, self.flush)
        self._ended_traces.append(trace)

    def flush(self) -> None:
        """Every finished request's spans to the queue."""
        finished, self._ended_traces = self._ended_traces, []
        spans: List[FinishedSpan] = []
        for trace in finished:
            spans += trace.spans(self._resource, self._scope)
        self._queue.add(spans)


def _new_id(bits: int) -> int:
    """A random trace (128) or span (64) id, never all zero (as the SDK's RandomIdGenerator makes them)."""
    value = random.getrandbits(bits)
    while not value:
        value = random.getrandbits(bits)
    return value


class UnrecordedTrace:
    """A request that is not sampled: its trace goes on (``traceparent``, flag 00), with no SDK span at all.

    The SDK's own unsampled span (the propagator, the sampler, the span) cost
    many times more on PyPy, on nearly every request at a low ratio
    (docs/tracing.md, "How a request's trace follows it").
    """

    __slots__ = ("trace_id", "traceparent")
    recording = False

    def __init__(self, trace_id: str, traceparent: str) -> None:
        self.trace_id = trace_id
        self.traceparent = traceparent

    def redis_call(
        self, name: str, started_ns: int, ended_ns: int, error: Optional[BaseException], attributes: Mapping[str, Any]
    ) -> None:
        pass

    def finish(self, status: int, args: Sequence[Any], grant: Any) -> None:
        pass


class UnrecordedIds:
    """Ids for requests not sampled: a random prefix per worker, then counted, as request ids are.

    W3C asks a trace id to be unique; only with the ``random`` flag (not
    set here) must it be random. Joined with ``+``, as ``api.counted_ids``
    says why.
    """

    def __init__(self) -> None:
        self._traces = CountedIds()
        self._span_prefix = (os.urandom(3) + b"\x01").hex()  # never all zero (W3C: an all-zero id is invalid)

    def new(self) -> UnrecordedTrace:
        counted = self._traces.count()
        trace_id = self._traces.prefix + counted
        return UnrecordedTrace(trace_id, "00-" + trace_id + "-" + self._span_prefix + counted[8:] + "-00")

    def within(self, trace_id: int) -> UnrecordedTrace:
        """Under a parent's trace that is not sampled."""
        parent = f"{trace_id:032x}"
        return UnrecordedTrace(parent, "00-" + parent + "-" + self._span_prefix + self._traces.count()[8:] + "-00")


class Tracing:
    """A worker's tracer: where its spans go, how many are sampled, and what is lost.

    Sampling is parent-based: a request with a valid ``traceparent`` follows
    its sampled flag; one without is sampled at ``sample``. Both decisions are
    made here, before the SDK is asked for anything, so that a request not
    sampled costs a header lookup and a random number (``UnrecordedTrace``).
    """

    def __init__(self, settings: Settings, losses: SpanLosses, reactor: Any) -> None:
        """``settings``: the worker's, of which its ``tracing_*``."""
        endpoint, service = settings.tracing_endpoint, settings.tracing_service
        self.losses = losses
        self._reactor = reactor
        resource = Resource.create(
            {"service.name": service, "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
        )
        self._sample = settings.tracing_sample
        self._unrecorded = UnrecordedIds()
        exporter = OtlpHttpExporter(endpoint.rstrip("/") + "/v1/traces", EXPORT_TIMEOUT)
        self._queue = SpanQueue(
            exporter, losses, settings.tracing_queue, settings.tracing_batch, settings.tracing_delay_ms / 1000
        )
        # Sampling is decided in begin, so what reaches the recorder is sampled: a new trace, or a sampled parent's.
        self._recorder = SpanRecorder(self._queue, resource, reactor)
        self._propagator = TraceContextTextMapPropagator()
        reactor.addSystemEventTrigger("before", "shutdown", self.close)

    def begin(self, method: str, route: str, path: str, headers: Any, request_id: str, operation: Any) -> Any:
        """A request's span (a ``RequestTrace``, or an ``UnrecordedTrace`` when not sampled), its parent the
        request's ``traceparent`` if valid (``route``: its path template; ``operation``: its
        ``handlers.operation.Operation``, None when it has none)."""
        parent = None
        # The stored name, past Cyclone's get (which normalizes the name it is given, on every request).
        if dict.get(headers, "Traceparent") is not None:
            extracted = self._propagator.extract(headers, getter=_HEADERS)
            parent = trace_api.get_current_span(extracted).get_span_context()
            if not parent.is_valid:
                parent = None  # invalid: ignored, a trace of its own (W3C)
            elif not parent.trace_flags.sampled:
                return self._unrecorded.within(parent.trace_id)
        if parent is None and self._sample < 1.0 and random.random() >= self._sample:
            return self._unrecorded.new()
        attributes = {
            "http.request.method": method,
            "http.route": route,
            "url.path": path,
            "jetway.request_id": request_id,
        }
        return RequestTrace(self._recorder, f"{method} {route}", attributes, parent, operation)

    def close(self) -> Any:
        """Send what is queued, for at most ``FLUSH_ON_STOP`` seconds, off the reactor's thread; then stop."""
        from twisted.internet import defer

        done: defer.Deferred = defer.Deferred()
        self._recorder.flush()  # the requests finished since the last tick

        def flush() -> None:
            self._queue.stop(FLUSH_ON_STOP)
            self._reactor.callFromThread(lambda: done.called or done.callback(None))

        threading.Thread(target=flush, name="jetway-trace-flush", daemon=True).start()
        timer = self._reactor.callLater(FLUSH_ON_STOP, lambda: done.called or done.callback(None))
        return done.addCallback(lambda _: timer.active() and timer.cancel())
