"""``/healthz`` (the process is up) and ``/readyz`` (and Redis answers)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from cache.store import DocumentStore
from handlers.base import RETRY_AFTER_SECONDS, JsonHandler
from handlers.errors import ApiError


class LivenessHandler(JsonHandler):
    ROUTE = "healthz"

    def get(self) -> None:
        self.send_bytes(200, b'{"status":"ok"}')

    head = get


class ReadinessHandler(JsonHandler):
    ROUTE = "readyz"

    def initialize(self, store: DocumentStore, reactor: Any, timeout: float) -> None:
        self.store = store
        self.reactor = reactor
        self.timeout = timeout

    @defer.inlineCallbacks
    def get(self) -> Any:
        try:
            yield self.store.ping().addTimeout(self.timeout, self.reactor)
        except Exception:
            # Any failure to answer means "not ready"; the reason is not the
            # load balancer's business.
            raise ApiError(503, "not-ready", "Redis does not answer", {"Retry-After": RETRY_AFTER_SECONDS}) from None
        self.send_bytes(200, b'{"status":"ready"}')

    head = get
