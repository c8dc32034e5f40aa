"""The resources (paths) of the API, each with the Cyclone handler it is routed to (``handlers.operations``)."""

from __future__ import annotations

from handlers import paths
from handlers.batch import BatchHandler
from handlers.changes import ChangesHandler
from handlers.collection_settings import CollectionSettingsHandler, CollectionSettingsListHandler
from handlers.collections import CollectionHandler
from handlers.docs import DocsAssetHandler, DocsPageHandler
from handlers.documents import DocumentHandler
from handlers.health import LivenessHandler, ReadinessHandler
from handlers.imports import ImportHandler
from handlers.metrics import MetricsHandler
from handlers.multi_get import MultiGetHandler
from handlers.openapi.handler import OpenApiHandler
from handlers.operation import Resource
from handlers.tickets import TicketHandler

# The paths, in Cyclone's order: Jetway's own /v1/_… before the document path,
# which would take "_get" for a collection; the API before the operational ones.
MULTI_GET = Resource(paths.MULTI_GET, MultiGetHandler, "A multi-get by POST.", "MultiGet", ("collection",))
TICKETS = Resource(
    paths.TICKETS,
    TicketHandler,
    "Tickets for a browser's `EventSource`, which cannot send `Authorization`.",
    "ChangesTicket",
    ("collection",),
)
CHANGES = Resource(
    paths.CHANGES,
    ChangesHandler,
    "A collection's change feed: every write (put, create, patch, delete) in order per document.",
    "Changes",
    ("collection",),
)
BATCH = Resource(paths.BATCH, BatchHandler, "Many operations in one request.", "Batch")
SETTINGS = Resource(
    paths.SETTINGS,
    CollectionSettingsHandler,
    "A collection's settings (admin scope).",
    "CollectionSettings",
    ("collection",),
)
SETTINGS_LIST = Resource(
    paths.SETTINGS_LIST,
    CollectionSettingsListHandler,
    "Every collection's settings (admin scope; a trailing slash is accepted).",
    "CollectionSettingsList",
    slash=True,
)
DOCUMENT = Resource(paths.DOCUMENT, DocumentHandler, "One document.", "Document", ("collection", "id"))
COLLECTION = Resource(
    paths.COLLECTION,
    CollectionHandler,
    "A collection (a trailing slash is accepted).",
    "Collection",
    ("collection",),
    slash=True,
)
HEALTHZ = Resource(paths.HEALTHZ, LivenessHandler, "Liveness: answers without touching Redis.", "Health")
READYZ = Resource(
    paths.READYZ,
    ReadinessHandler,
    "Readiness: answers once Redis answers a PING, within at most a second.",
    "Readiness",
)
METRICS = Resource(
    paths.METRICS, MetricsHandler, "Prometheus metrics, aggregated over every worker of this instance.", "Metrics"
)
OPENAPI = Resource(paths.OPENAPI, OpenApiHandler, "The OpenAPI 3.1 description of the API.", "OpenApi")
DOCS = Resource(
    paths.DOCS, DocsPageHandler, "Swagger UI (off with `JETWAY_DOCS=off`).", "Docs", slash=True, with_docs=True
)
DOCS_ASSET = Resource(
    paths.DOCS_ASSET,
    DocsAssetHandler,
    "The page's assets, from a packaged Swagger UI.",
    "DocsAsset",
    ("asset",),
    with_docs=True,
)
IMPORT = Resource(
    paths.IMPORT,
    ImportHandler,
    "Documents from an NDJSON body, written as it arrives.",
    "Import",
    ("collection",),
)
