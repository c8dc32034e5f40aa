"""What starts a worker's tracing, without loading the OpenTelemetry SDK unless tracing is on.

``make_app`` gives the application this starter; the application calls it
once it listens (``api.application.JetwayApplication.listen_on``), so the
warm-ups' throwaway applications never trace and never export.
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def tracing_starter(settings: Any, metrics: Any, reactor: Any) -> Optional[Callable[[], Any]]:
    """None when ``JETWAY_TRACING_ENDPOINT`` is unset; else what makes the worker's ``api.tracing.Tracing``."""
    if not settings.tracing_endpoint:
        return None

    def start() -> Any:
        from api.span_queue import SpanLosses
        from api.tracing import Tracing  # the SDK, imported only now

        metrics.span_losses = losses = SpanLosses()
        return Tracing(settings, losses, reactor)

    return start
