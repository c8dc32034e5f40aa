"""What the server tells about itself: access log lines and Prometheus metrics.

Metrics are aggregated over all workers of an instance with
``prometheus_client``'s multiprocess mode: each process writes its values to
memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR`` (the master makes one
and hands it to its workers), and a scrape of any worker reads them all.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from twisted.logger import Logger

from api.metrics_dir import MULTIPROC_ENV

_TOKEN = re.compile(r"jw_[A-Za-z0-9_-]{20,}")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def redact(text: str) -> str:
    """Anything shaped like a Jetway token, replaced (a client may put one in a URL)."""
    return _TOKEN.sub("jw_[redacted]", text)


class Metrics:
    """This process's metric objects (not registered globally)."""

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

    def observe_redis(self, operation: str, seconds: float, error: Optional[str]) -> None:
        self.redis_latency.labels(operation).observe(seconds)
        if error is not None:
            self.redis_errors.labels(error).inc()


def worker_restarts() -> Counter:
    """The master's counter of workers it had to restart."""
    return Counter("jetway_worker_restarts", "Workers the master restarted", registry=None)


def render_metrics(fallback: Metrics) -> Callable[[], bytes]:
    """The /metrics body: every process of the instance, or this one alone."""
    directory = os.environ.get(MULTIPROC_ENV)

    def render() -> bytes:
        registry = CollectorRegistry()
        if directory:
            MultiProcessCollector(registry, path=directory)
        else:
            for metric in vars(fallback).values():
                registry.register(metric)
        return generate_latest(registry)

    return render


class Observer:
    """Called by the application as connections and requests come and go."""

    log = Logger(namespace="jetway.access")

    def __init__(self, metrics: Metrics, access_log: bool) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def connection_opened(self) -> None:
        self.metrics.connections.inc()

    def connection_closed(self) -> None:
        self.metrics.connections.dec()

    def request_finished(self, handler: Any) -> None:
        """Cyclone's ``log_function``: metrics always, the access line if wanted."""
        request = handler.request
        seconds = request.request_time()
        route = getattr(handler, "ROUTE", "unknown")
        status = handler.get_status()
        self.metrics.requests.labels(route, request.method, str(status)).inc()
        self.metrics.latency.labels(route).observe(seconds)
        if self.access_log:
            self.log.info(
                "{method} {path} {status} ({client}) {duration_ms}ms",
                method=request.method,
                path=redact(request.uri),
                status=status,
                client=request.remote_ip,
                duration_ms=round(seconds * 1000, 2),
                request_id=getattr(handler, "request_id", None),
            )
