"""``/metrics``: Prometheus text for every worker of this instance."""

from __future__ import annotations

from typing import Callable

from handlers.base import JsonHandler

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsHandler(JsonHandler):
    ROUTE = "metrics"

    def initialize(self, render: Callable[[], bytes]) -> None:
        self.render = render

    def get(self) -> None:
        self.send_bytes(200, self.render(), METRICS_TYPE)

    head = get
