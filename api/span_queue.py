"""A worker's finished spans on their way to the collector: a bounded queue that one thread of its own empties.

The reactor's thread adds a tick's spans (``add``); the exporter's thread
takes them in batches of at most ``max_batch``, every ``every`` seconds or as
soon as a batch is full, and hands each batch to the exporter. A span that
finds the queue full, or whose batch the collector did not take, is counted
(``SpanLosses``) and lost: the reactor never waits for a collector.

It does what the SDK's ``BatchSpanProcessor`` did here, at the same cost
(docs/tracing.md, "What it costs"), and counts its own losses: the SDK's
processor reported its drops only through a meter, which had to be faked
to read them.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Dict, List

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


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


class SpanQueue:
    """Spans added on the reactor's thread, exported on the queue's own (``jetway-trace-export``): at most
    ``max_queue`` held, ``max_batch`` per export, each waiting ``every`` seconds at most (``api.config``'s
    ``tracing_queue``, ``tracing_batch`` and ``tracing_delay_ms``)."""

    def __init__(
        self,
        exporter: SpanExporter,
        losses: SpanLosses,
        max_queue: int,
        max_batch: int,
        every: float,
    ) -> None:
        self._exporter = exporter
        self._losses = losses
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._every = every
        # A deque: its append and popleft are each atomic, so the two threads need no lock.
        self._spans: Deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="jetway-trace-export", daemon=True)
        self._thread.start()

    def add(self, spans: List[Any]) -> None:
        """Queue spans, or count those past the queue's room as lost."""
        room = self._max_queue - len(self._spans)
        if len(spans) > room:
            self._losses.add("queue_full", len(spans) - max(room, 0))
            spans = spans[: max(room, 0)]
        self._spans.extend(spans)
        if len(self._spans) >= self._max_batch:
            self._wake.set()

    def stop(self, timeout: float) -> None:
        """Send what is queued and close the exporter, waiting ``timeout`` seconds at most (blocks: not on the
        reactor's thread)."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._every)
            self._wake.clear()
            self._send_queued()
        self._send_queued()
        self._exporter.shutdown()

    def _send_queued(self) -> None:
        spans = self._spans
        while spans:
            batch = [spans.popleft() for _ in range(min(self._max_batch, len(spans)))]
            try:
                result = self._exporter.export(batch)
            except Exception:  # an exporter's bug loses its batch, never the thread
                result = SpanExportResult.FAILURE
            if result is not SpanExportResult.SUCCESS:
                self._losses.add("export_failed", len(batch))
