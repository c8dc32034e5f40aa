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
- Every request, sampled or not, takes the same steps and gathers the same
  plain data (``RequestTrace`` says why); a sampled one's spans
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
_FLAGS = ("-00", "-01")  # a traceparent's end: not sampled, sampled
# Sampled requests one tick can hold (SpanRecorder); a power of two, past the span queue's default room.
RING_ROOM = 4096
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
    """A request's trace, sampled or not: one class, and the same steps on the request path for both.

    On PyPy a path that only the sampled requests take is a rare path, and
    a rare path that goes on through the rest of a request's handling is
    seldom compiled: a few in ten sampled requests ran it interpreted, at
    ten to fifty times a request's cost (docs/tracing.md, "What it costs").
    So whether a request is sampled is data here, not a branch: its ids come
    from the same counters, its flag from a table (``recording``: 0 or 1),
    and its end writes it into the recorder's ring, where only a sampled one
    stays (``SpanRecorder.ended``). What its span needs beyond that (its
    attributes, its ids as numbers) is worked out at the flush, off the
    request path. Only the Redis calls of a sampled request differ: it alone
    is made active for them (``cache.trace_scope``).

    ``traceparent``: what the response carries; ``trace_id``: what the
    access line and problem details carry.
    """

    __slots__ = (
        "_recorder",
        "args",
        "calls",
        "end_ns",
        "grant",
        "method",
        "operation",
        "parent",
        "path",
        "recording",
        "redis_spans",
        "request_id",
        "route",
        "span_id",
        "start_ns",
        "status",
        "trace_id",
        "traceparent",
    )

    def __init__(
        self,
        recorder: SpanRecorder,
        ids: Tuple[str, str, int],
        parent: Optional[SpanContext],
        method: str,
        route: str,
        path: str,
        request_id: str,
        operation: Any,
    ) -> None:
        """``ids``: its trace id and span id (lower-case hex) and whether it is sampled (1) or not (0);
        ``route``: the path template; ``operation``: its ``handlers.operation.Operation``, None when it has none."""
        self._recorder = recorder
        self.trace_id, self.span_id, self.recording = ids
        self.traceparent = "00-" + self.trace_id + "-" + self.span_id + _FLAGS[self.recording]
        self.parent = parent
        self.method = method
        self.route = route
        self.path = path
        self.request_id = request_id
        self.operation = operation
        self.redis_spans = 0  # Redis calls made under it, kept or not (MAX_REDIS_SPANS)
        self.calls: Optional[List[Tuple[str, int, int, Optional[str], Mapping[str, Any]]]] = None  # on the first
        self.status = 0
        self.args: Sequence[Any] = ()
        self.grant: Any = None
        self.start_ns = time.time_ns()
        self.end_ns = 0  # set by finish: the span ended

    def redis_call(
        self, name: str, started_ns: int, ended_ns: int, error: Optional[BaseException], attributes: Mapping[str, Any]
    ) -> None:
        """A Redis round trip of this (sampled) request, kept to become a child span (``cache.redis.metered``)."""
        if self.end_ns:
            return  # ended: a loop the request started
        self.redis_spans += 1
        if self.redis_spans > MAX_REDIS_SPANS:
            return  # past the bound: counted only
        if self.calls is None:
            self.calls = []
        self.calls.append((name, started_ns, ended_ns, None if error is None else type(error).__name__, attributes))

    def finish(self, status: int, args: Sequence[Any], grant: Any) -> None:
        """The request answered ``status`` (``args``: its path's arguments; ``grant``: a
        ``handlers.http.auth.Grant``, whose token's name the span carries, never the token). Once: a second
        end changes nothing."""
        if self.end_ns:
            return
        self.status = status
        self.args = args
        self.grant = grant
        self.end_ns = time.time_ns()
        self._recorder.ended(self)

    def spans(self, resource: Resource, scope: InstrumentationScope) -> List[FinishedSpan]:
        """Its Redis calls' spans, then its own, as the exporter encodes them (``SpanRecorder.flush``)."""
        parent = self.parent
        own = SpanIds(int(self.trace_id, 16), int(self.span_id, 16), None if parent is None else parent.trace_state)
        made = []
        for name, started_ns, ended_ns, error, attributes in self.calls or ():
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
        attributes = self._attributes()
        status = Status(StatusCode.ERROR) if self.status >= 500 else _OK
        name = f"{self.method} {self.route}"
        made.append(
            FinishedSpan(
                name, own, parent, resource, attributes, SpanKind.SERVER, status, self.start_ns, self.end_ns, scope
            )
        )
        return made

    def _attributes(self) -> Dict[str, Any]:
        """Its span's attributes: the request's, its operation's name, its collection and its token's name."""
        attributes: Dict[str, Any] = {
            "http.request.method": self.method,
            "http.route": self.route,
            "url.path": self.path,
            "jetway.request_id": self.request_id,
            "http.response.status_code": self.status,
        }
        operation, args = self.operation, self.args
        if operation is not None:
            attributes["jetway.operation"] = operation.operation_id
            template = operation.path
            if args and template.find("{") == template.find("{collection}") >= 0:  # the path's first argument
                attributes["jetway.collection"] = str(args[0])
        record = getattr(self.grant, "record", None)
        if record is not None:
            attributes["jetway.token.name"] = record.name
        if self.status >= 500:
            attributes["error.type"] = str(self.status)
        if self.redis_spans > MAX_REDIS_SPANS:
            attributes["jetway.redis_spans_dropped"] = self.redis_spans - MAX_REDIS_SPANS
        return attributes


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
    """Ended requests, sampled ones kept in a ring, made into their spans and handed to the span queue once a tick.

    ``ended`` is what a request's end costs, sampled or not, with no branch
    (``RequestTrace`` says why): it writes the trace in the ring's next slot
    and moves past it only if the trace is sampled, so a request not sampled
    is overwritten by the next. ``flush`` runs from the reactor every
    ``every`` seconds, so the spans reach the queue in the order the requests
    ended, on the thread that made them. Past the ring's room in one tick,
    the oldest are lost and counted as ``queue_full``.
    """

    def __init__(
        self,
        queue: Any,
        resource: Resource,
        reactor: Any,
        losses: SpanLosses,
        every: float = FLUSH_EVERY,
        room: int = RING_ROOM,
    ) -> None:
        """``room``: a power of two."""
        self._queue = queue
        self._resource = resource
        self._scope = InstrumentationScope("jetway")
        self._reactor = reactor
        self._losses = losses
        self._every = every
        self._ring: List[Optional[RequestTrace]] = [None] * room
        self._mask = room - 1
        self._ended = 0  # sampled requests ended, ever: the next slot is this one's
        self._flushed = 0  # of which flushed
        self._tick = reactor.callLater(every, self._on_tick)

    def ended(self, trace: RequestTrace) -> None:
        self._ring[self._ended & self._mask] = trace
        self._ended += trace.recording

    def flush(self) -> None:
        """Every sampled request ended since the last flush, as spans, to the queue."""
        ended, ring, mask = self._ended, self._ring, self._mask
        # The next slot is being overwritten by requests not sampled, so a full ring keeps one fewer.
        kept = min(ended - self._flushed, mask)
        if ended - self._flushed > kept:
            self._losses.add("queue_full", ended - self._flushed - kept)
        self._flushed = ended
        spans: List[FinishedSpan] = []
        for number in range(ended - kept, ended):
            trace = ring[number & mask]
            ring[number & mask] = None
            if trace is not None:
                spans += trace.spans(self._resource, self._scope)
        if spans:
            self._queue.add(spans)

    def stop(self) -> None:
        """The last flush; no tick after it."""
        if self._tick.active():
            self._tick.cancel()
        self.flush()

    def _on_tick(self) -> None:
        self._tick = self._reactor.callLater(self._every, self._on_tick)
        self.flush()


def _new_id(bits: int) -> int:
    """A random span id (64 bits) for a Redis call's span, never all zero (as the SDK's RandomIdGenerator)."""
    value = random.getrandbits(bits)
    while not value:
        value = random.getrandbits(bits)
    return value


class TraceIds:
    """A worker's trace and span ids: a random prefix each, then a count, as request ids (``api.counted_ids``).

    The same for a sampled request and one not sampled (``RequestTrace``
    says why). W3C asks a random trace id only with its ``random`` flag,
    which is not set; a count under a random prefix is unique, as it asks.
    """

    def __init__(self) -> None:
        self._traces = CountedIds()
        self._span_prefix = (os.urandom(3) + b"\x01").hex()  # never all zero (W3C: an all-zero id is invalid)

    def new(self) -> Tuple[str, str]:
        """A new trace id (32 hex digits) and span id (16)."""
        count = self._traces.count()
        return self._traces.prefix + count, self._span_prefix + count[8:]


class Tracing:
    """A worker's tracer: where its spans go, how many are sampled, and what is lost.

    Sampling is parent-based: a request with a valid ``traceparent`` follows
    its sampled flag; one without is sampled at ``sample``. Both decisions are
    made here, before the SDK is asked for anything.

    The ids of a trace a request starts, sampled or not, are a worker's
    (``TraceIds``).
    """

    def __init__(self, settings: Settings, losses: SpanLosses, reactor: Any) -> None:
        """``settings``: the worker's, of which its ``tracing_*``."""
        endpoint, service = settings.tracing_endpoint, settings.tracing_service
        self.losses = losses
        self._reactor = reactor
        resource = Resource.create(
            {"service.name": service, "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
        )
        self._always = settings.tracing_sample >= 1.0
        # Below 1 - 2**-52, random() + sample stays below 2 as floats round: its whole part is 1 or 0.
        self._sample = min(settings.tracing_sample, 1.0 - 2.0**-52)
        self._ids = TraceIds()
        exporter = OtlpHttpExporter(endpoint.rstrip("/") + "/v1/traces", EXPORT_TIMEOUT)
        self._queue = SpanQueue(
            exporter, losses, settings.tracing_queue, settings.tracing_batch, settings.tracing_delay_ms / 1000
        )
        self._recorder = SpanRecorder(self._queue, resource, reactor, losses)
        self._propagator = TraceContextTextMapPropagator()
        reactor.addSystemEventTrigger("before", "shutdown", self.close)

    def begin(self, method: str, route: str, path: str, headers: Any, request_id: str, operation: Any) -> RequestTrace:
        """A request's trace, its parent the request's ``traceparent`` if valid (``route``: its path template;
        ``operation``: its ``handlers.operation.Operation``, None when it has none)."""
        trace_id, span_id = self._ids.new()
        parent = None
        # The stored name, past Cyclone's get (which normalizes the name it is given, on every request).
        if dict.get(headers, "Traceparent") is not None:
            extracted = self._propagator.extract(headers, getter=_HEADERS)
            parent = trace_api.get_current_span(extracted).get_span_context()
            if not parent.is_valid:
                parent = None  # invalid: ignored, a trace of its own (W3C)
        if parent is None:
            # Sampled is a number, not a comparison's branch (RequestTrace says why): 1 with chance ``sample``.
            sampled = 1 if self._always else int(random.random() + self._sample)
            ids = (trace_id, span_id, sampled)
        else:
            ids = (f"{parent.trace_id:032x}", span_id, 1 if parent.trace_flags.sampled else 0)
        return RequestTrace(self._recorder, ids, parent, method, route, path, request_id, operation)

    def close(self) -> Any:
        """Send what is queued, for at most ``FLUSH_ON_STOP`` seconds, off the reactor's thread; then stop."""
        from twisted.internet import defer

        done: defer.Deferred = defer.Deferred()
        self._recorder.stop()  # the requests finished since the last tick

        def flush() -> None:
            self._queue.stop(FLUSH_ON_STOP)
            self._reactor.callFromThread(lambda: done.called or done.callback(None))

        threading.Thread(target=flush, name="jetway-trace-flush", daemon=True).start()
        timer = self._reactor.callLater(FLUSH_ON_STOP, lambda: done.called or done.callback(None))
        return done.addCallback(lambda _: timer.active() and timer.cancel())
