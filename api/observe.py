"""What the server tells about itself: access log lines, Prometheus metrics, and the end of each request's span.

Metrics are aggregated over all workers of an instance with
``prometheus_client``'s multiprocess mode: each process writes its values to
memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR`` (the master makes one
and hands it to its workers), and a scrape of any worker reads them all.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from api.logs import AccessLog
from api.metrics_dir import MULTIPROC_ENV
from handlers.feed.stats import FeedStats

_TOKEN = re.compile(r"jw_[A-Za-z0-9_-]{20,}")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def redact(text: str) -> str:
    """Anything shaped like a Jetway token, replaced (a client may put one in a URL)."""
    return _TOKEN.sub("jw_[redacted]", text) if "jw_" in text else text


class HistogramBatch:
    """Observations of one histogram child, kept in memory until a flush."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def flush_into(self, child: Any) -> None:
        # prometheus_client has no bulk observe. Its histogram child keeps
        # one (non-cumulative) value per bucket in _buckets and the sum in
        # _sum; tests/api/test_observe.py checks this against observe().
        child._sum.inc(self.total)
        for bucket, count in zip(child._buckets, self.counts):
            if count:
                bucket.inc(count)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0


class Metrics:
    """This process's metrics: counted in memory per request, written out by ``flush``.

    In multiprocess mode every update is a write to a memory-mapped file;
    a request made five of them, about a sixth of a 200 B read's CPU time
    on PyPy. Batching makes the request path a few dict updates and leaves
    a scrape at most one flush interval behind for other workers (a scrape
    flushes the worker that answers it).
    """

    def __init__(self) -> None:
        self.requests = Counter(
            "jetway_requests", "HTTP requests by route and status", ["route", "method", "status"], registry=None
        )
        self.latency = Histogram(
            "jetway_request_duration_seconds", "HTTP request latency", ["route"], buckets=_BUCKETS, registry=None
        )
        self.redis_latency = Histogram(
            "jetway_redis_duration_seconds", "Redis call latency", ["operation"], buckets=_BUCKETS, registry=None
        )
        self.redis_errors = Counter("jetway_redis_errors", "Failed Redis calls by kind", ["kind"], registry=None)
        self.connections = Gauge(
            "jetway_open_connections", "Open client connections", multiprocess_mode="livesum", registry=None
        )
        self.log_lines_dropped = log_lines_dropped()
        self.direct_answers = Counter(
            "jetway_direct_answers",
            "Requests answered by the connection without Cyclone, by kind (hot_read, redis_read, write, health, error)",
            ["kind"],
            registry=None,
        )
        self._direct_answers: Dict[str, int] = defaultdict(int)  # since the last flush
        self.open_connections = 0
        self.hot_cache: Optional[HotCacheMetrics] = None
        self._dropped_lines = 0
        self.trace_spans_dropped = Counter(
            "jetway_trace_spans_dropped",
            "Spans lost: the export queue was full (queue_full) or the collector did not take them (export_failed)",
            ["reason"],
            registry=None,
        )
        self.span_losses: Optional[Any] = None  # the worker's api.tracing.SpanLosses, once tracing starts
        # The change feed's counters (handlers/feed/event_stream.py), copied out at each flush.
        self.feed_subscribers = Gauge(
            "jetway_feed_subscribers", "Open change-feed streams", multiprocess_mode="livesum", registry=None
        )
        self.feed_events = Counter("jetway_feed_events_sent", "Change events written to streams", registry=None)
        self.feed_fell_behind = Counter(
            "jetway_feed_fell_behind", "Streams ended because their client did not read", registry=None
        )
        self.feed_lost = Counter("jetway_feed_lost", "Streams ended because their position was gone", registry=None)
        self.feed_stats = FeedStats()
        self._feed_flushed = FeedStats()
        self.index_build_steps = Counter(
            "jetway_index_build_steps",
            "Steps of declared indexes' builds the workers ran (up to 256 documents each, cache/indexes/builds.py)",
            registry=None,
        )
        self.index_builds: Optional[Any] = None  # the store's cache.indexes.builds.IndexBuilds
        self._index_steps_flushed = 0
        self.expiries = Counter(
            "jetway_expiries",
            "Expiries carried out: entries removed, event logged (cache/documents/expiry.py)",
            registry=None,
        )
        self.expiry_lag = Gauge(
            "jetway_expiry_lag_seconds",
            "How long the oldest due expiry a sweeping worker saw at its last look had been due",
            multiprocess_mode="livemax",
            registry=None,
        )
        self.expiry: Optional[Any] = None  # the worker's cache.documents.expiry.ExpirySweeper
        self._expiries_flushed = 0
        self._bounds = (*_BUCKETS, float("inf"))
        # The status as a number: its text is made at the flush, not per request.
        self._requests: Dict[Tuple[str, str, int], int] = defaultdict(int)
        self._latency: Dict[str, HistogramBatch] = {}
        self._redis_latency: Dict[str, HistogramBatch] = {}
        self._redis_errors: Dict[str, int] = defaultdict(int)

    def count_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self._requests[(route, method, status)] += 1
        self._batch(self._latency, route).observe(seconds)

    def count_direct(self, kind: str) -> None:
        self._direct_answers[kind] += 1

    def observe_redis(self, operation: str, seconds: float, error: Optional[str]) -> None:
        self._batch(self._redis_latency, operation).observe(seconds)
        if error is not None:
            self._redis_errors[error] += 1

    def count_dropped_lines(self, lines: int) -> None:
        """Log lines this process had to drop (``api.log_writer``)."""
        self._dropped_lines += lines

    def flush(self) -> None:
        """Write what was counted since the last flush to the shared files."""
        if self._dropped_lines:
            self.log_lines_dropped.inc(self._dropped_lines)
            self._dropped_lines = 0
        if self.span_losses is not None:
            for reason, spans in self.span_losses.taken().items():
                self.trace_spans_dropped.labels(reason).inc(spans)
        for kind, count in self._direct_answers.items():
            self.direct_answers.labels(kind).inc(count)
        self._direct_answers.clear()
        for (route, method, status), count in self._requests.items():
            self.requests.labels(route, method, str(status)).inc(count)
        for kind, count in self._redis_errors.items():
            self.redis_errors.labels(kind).inc(count)
        self._requests.clear()
        self._redis_errors.clear()
        for route, batch in self._latency.items():
            batch.flush_into(self.latency.labels(route))
        for operation, batch in self._redis_latency.items():
            batch.flush_into(self.redis_latency.labels(operation))
        self.connections.set(self.open_connections)
        if self.hot_cache is not None:
            self.hot_cache.flush()
        self._flush_feed()
        if self.index_builds is not None:
            steps = self.index_builds.steps
            self.index_build_steps.inc(steps - self._index_steps_flushed)
            self._index_steps_flushed = steps
        if self.expiry is not None:
            expired = self.expiry.expired
            self.expiries.inc(expired - self._expiries_flushed)
            self._expiries_flushed = expired
            self.expiry_lag.set(self.expiry.lag_seconds)

    def _flush_feed(self) -> None:
        stats, flushed = self.feed_stats, self._feed_flushed
        self.feed_subscribers.set(stats.subscribers)
        self.feed_events.inc(stats.events_sent - flushed.events_sent)
        self.feed_fell_behind.inc(stats.fell_behind - flushed.fell_behind)
        self.feed_lost.inc(stats.lost - flushed.lost)
        self._feed_flushed = FeedStats(stats.subscribers, stats.events_sent, stats.fell_behind, stats.lost)

    def _batch(self, batches: Dict[str, HistogramBatch], label: str) -> HistogramBatch:
        batch = batches.get(label)
        if batch is None:
            batch = batches[label] = HistogramBatch(self._bounds)
        return batch


class HotCacheMetrics:
    """The hot cache's figures (``cache.hot.cache.HotCache.stats``), per worker and summed over the instance.

    The cache counts in plain attributes on the read path; a flush turns the
    counts since the last one into counter increments (summed over workers)
    and sets the worker's own gauges (one series per worker, by ``pid``).
    """

    COUNTS = ("hits", "misses", "evictions", "invalidations", "refused_fills", "refused_admissions", "lagging")
    LEVELS = ("bytes", "entries", "bypassed")

    def __init__(self, stats: Callable[[], Dict[str, int]]) -> None:
        self._stats = stats
        self._flushed: Dict[str, int] = dict.fromkeys(self.COUNTS, 0)
        self.counters = {
            name: Counter(f"jetway_hot_cache_{name}", f"Hot cache {name.replace('_', ' ')}", registry=None)
            for name in self.COUNTS
        }
        self.levels = {
            "bytes": Gauge(
                "jetway_hot_cache_bytes", "Bytes the hot caches hold", multiprocess_mode="livesum", registry=None
            ),
            "entries": Gauge(
                "jetway_hot_cache_entries", "Documents the hot caches hold", multiprocess_mode="livesum", registry=None
            ),
            "bypassed": Gauge(
                "jetway_hot_cache_bypassed",
                "Workers whose hot cache is bypassed (an invalidation connection is down)",
                multiprocess_mode="livesum",
                registry=None,
            ),
        }
        self.worker = Gauge(
            "jetway_hot_cache_worker",
            "One worker's hot cache figures: counts since it started, and its bytes, entries and bypass state now",
            ["stat"],
            multiprocess_mode="liveall",
            registry=None,
        )

    def flush(self) -> None:
        stats = self._stats()
        for name in self.COUNTS:
            delta = stats[name] - self._flushed[name]
            if delta:
                self.counters[name].inc(delta)
            self._flushed[name] = stats[name]
        for name in self.LEVELS:
            self.levels[name].set(stats[name])
        for name in (*self.COUNTS, *self.LEVELS):
            self.worker.labels(name).set(stats[name])

    def metrics(self) -> List[Any]:
        return [*self.counters.values(), *self.levels.values(), self.worker]


def worker_restarts() -> Counter:
    """The master's counter of workers it had to restart."""
    return Counter("jetway_worker_restarts", "Workers the master restarted", registry=None)


def log_lines_dropped() -> Counter:
    """Log lines a process could not write (its output full or gone for too long): the master's and each worker's."""
    return Counter(
        "jetway_log_lines_dropped", "Log lines dropped because the log output did not take them", registry=None
    )


def render_metrics(fallback: Metrics) -> Callable[[], bytes]:
    """The /metrics body: every process of the instance, or this one alone."""
    directory = os.environ.get(MULTIPROC_ENV)

    def render() -> bytes:
        fallback.flush()
        registry = CollectorRegistry()
        if directory:
            MultiProcessCollector(registry, path=directory)
        else:
            for metric in vars(fallback).values():
                if isinstance(metric, (Counter, Gauge, Histogram)):
                    registry.register(metric)
            for metric in fallback.hot_cache.metrics() if fallback.hot_cache else ():
                registry.register(metric)
        return generate_latest(registry)

    return render


class Observer:
    """Called by the application as connections and requests come and go."""

    def __init__(self, metrics: Metrics, access_log: Optional[AccessLog]) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def connection_opened(self) -> None:
        self.metrics.open_connections += 1

    def connection_closed(self) -> None:
        self.metrics.open_connections -= 1

    def request_finished(self, handler: Any) -> None:
        """Cyclone's ``log_function``: metrics always, the access line if wanted, the request's span ended."""
        request = handler.request
        status = handler.get_status()
        trace = getattr(handler, "trace", None)
        if trace is not None:
            trace.finish(status, handler.path_args or (), getattr(handler, "grant", None))
        self.answered(
            getattr(handler, "ROUTE", "unknown"),
            request.method,
            request.uri,
            status,
            request.remote_ip,
            request.request_time(),
            getattr(handler, "request_id", ""),
            "" if trace is None else trace.trace_id,
        )

    def answered_directly(
        self,
        route: str,
        method: str,
        uri: str,
        status: int,
        client: str,
        seconds: float,
        request_id: str,
        kind: str,
        exchange: Any = None,
    ) -> None:
        """A request's pipeline was run and answered by the connection, without Cyclone (``handlers.pipeline``);
        ``exchange``: the request as its pipeline saw it, whose span (if traced) ends here."""
        self.metrics.count_direct(kind)
        trace = None if exchange is None else exchange.trace
        if trace is not None:
            trace.finish(status, exchange.args, exchange.grant)
        self.answered(route, method, uri, status, client, seconds, request_id, "" if trace is None else trace.trace_id)

    def answered(
        self,
        route: str,
        method: str,
        uri: str,
        status: int,
        client: str,
        seconds: float,
        request_id: str,
        trace_id: str = "",
    ) -> None:
        """A request was answered (by a handler, or by the hot read): its metrics and its access line."""
        self.metrics.count_request(route, method, status, seconds)
        if self.access_log is not None:
            self.access_log.request(method, redact(uri), status, client, seconds, request_id, trace_id)

    def flush(self) -> None:
        """Metrics and access lines out now (the worker is stopping)."""
        self.metrics.flush()
        if self.access_log is not None:
            self.access_log.flush()
