"""The application assembled: each handler's dependencies, routed by the operation table (handlers.operations)."""

from __future__ import annotations

import sys
from typing import Any, Optional

from api.application import JetwayApplication
from api.config import Settings
from api.connection import HttpLimits
from api.log_writer import LineWriter
from api.logs import AccessLog, Lines
from api.observe import Metrics, Observer, render_metrics
from api.tracing_start import tracing_starter
from cache.batches.batch import BatchRunner
from cache.credentials.tickets import TicketStore
from cache.documents.idempotency import IdempotencyRecords
from cache.documents.store import DocumentStore
from cache.memory_return import MemoryReturn
from cache.settings_cache import SettingsCache
from handlers.base import NoRouteHandler
from handlers.batch import BatchHandler
from handlers.changes import ChangesHandler
from handlers.collection_settings import CollectionSettingsHandler, CollectionSettingsListHandler
from handlers.collections import CollectionHandler
from handlers.docs import DocsAssetHandler, DocsPageHandler, packaged_site
from handlers.document_answers import DocumentAnswers
from handlers.documents import DocumentHandler
from handlers.feed.feed import Feed
from handlers.health import PING_TIMEOUT, Liveness, LivenessHandler, ReadinessHandler, ReadinessProbe
from handlers.http.auth import Gate
from handlers.http.cors import CorsPolicy
from handlers.http.negotiation import Negotiator
from handlers.imports import ImportHandler
from handlers.metrics import MetricsHandler
from handlers.multi_get import MultiGetHandler
from handlers.openapi.collections import OpenApiSource
from handlers.openapi.handler import OpenApiHandler
from handlers.operation import routes as operation_routes
from handlers.operations import OPERATIONS
from handlers.tickets import TicketGate, TicketHandler


def make_app(
    settings: Settings,
    store: DocumentStore,
    gate: Gate,
    reactor: Any,
    metrics: Optional[Metrics] = None,
    idempotency: Optional[IdempotencyRecords] = None,
    batches: Optional[BatchRunner] = None,
    collections: Optional[SettingsCache] = None,
    log_lines: Optional[Lines] = None,
    feed: Optional[Feed] = None,
    tickets: Optional[TicketStore] = None,
) -> JetwayApplication:
    """The application; access lines go to ``log_lines`` (the worker's ``LineWriter``), or else to stdout.

    Without ``feed`` (JETWAY_FEED=off) the change feed's routes answer 404 ``feed-off``.
    """
    metrics = metrics or Metrics()
    if feed is not None:
        metrics.feed_stats = feed.stats
    documents = {
        "store": store,
        "max_body": settings.max_body,
        "gate": gate,
        "max_ids": settings.max_ids,
        "cache_control": settings.cache_control,
        "negotiator": Negotiator(),
        "compress_min_bytes": settings.compress_min_bytes,
        "idempotency": idempotency,
        "collections": collections,
    }
    # The handlers whose answers are composed from many stored documents: one budget, one memory pass.
    memory = MemoryReturn(reactor)
    budgeted = {**documents, "response_budget": settings.max_response_bytes, "memory": memory}
    changes = {**documents, "feed": feed, "ticket_gate": TicketGate(tickets, gate) if tickets and feed else None}
    docs = {"site": packaged_site}
    readiness = ReadinessProbe(store, reactor, min(PING_TIMEOUT, settings.redis_timeout))
    # The document read's and replace's pipelines: run by the connection, or by DocumentHandler.
    answers = DocumentAnswers(
        store, gate, collections, documents["negotiator"], settings.cache_control, settings.max_body
    )
    # Each handler's dependencies; the routes themselves come from the operation table.
    dependencies = {
        MultiGetHandler: budgeted,
        TicketHandler: {**documents, "tickets": tickets if feed else None},
        ChangesHandler: changes,
        BatchHandler: {**budgeted, "batches": batches, "max_operations": settings.max_batch_ops},
        CollectionSettingsHandler: documents,
        CollectionSettingsListHandler: documents,
        DocumentHandler: {**documents, "answers": answers},
        CollectionHandler: budgeted,
        ImportHandler: {**documents, "batches": batches},
        LivenessHandler: {"answers": Liveness()},
        ReadinessHandler: {"probe": readiness},
        MetricsHandler: {"render": render_metrics(metrics)},
        OpenApiHandler: {
            "source": OpenApiSource(OPERATIONS, settings.max_ids, collections, settings.docs, settings.feed_max_wait)
        },
        DocsPageHandler: docs,
        DocsAssetHandler: docs,
    }
    routes = operation_routes(OPERATIONS, dependencies, settings.docs)
    limits = HttpLimits(
        max_body=settings.max_body,
        max_batch_body=settings.max_batch_bytes,
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        body_min_rate=settings.body_min_rate,
        keepalive_timeout=settings.keepalive_timeout,
        send_timeout=settings.send_timeout,
        body_budget=settings.body_budget,
        max_connections=settings.max_connections,
        trusted_proxies=settings.trusted_proxies,
    )
    access_log = None
    if settings.access_log:
        lines = log_lines or LineWriter(sys.stdout.fileno(), False, metrics.count_dropped_lines)
        access_log = AccessLog(lines, settings.json_logs, reactor)
    observer = Observer(metrics, access_log)
    app = JetwayApplication(routes, reactor, limits, observer, error_handler=NoRouteHandler)
    app.debug_burn_seconds = settings.debug_burn_us / 1e6
    app.cors = CorsPolicy(settings.cors_origins)
    app.direct_answers = settings.direct_answers
    app.start_tracing = tracing_starter(settings, metrics, reactor)
    return app
