"""The operations of the service itself, in the operation table (``handlers.operations``): health, metrics, docs.

None of them touches a collection or needs a token; they are the ones a load
balancer, a Prometheus scraper or a browser asks. ``/healthz`` names a
pipeline (``handlers.health.Liveness``): the connection answers it without a
handler.
"""

from __future__ import annotations

from typing import Tuple

from handlers.docs import ASSET_NAMES, ASSET_TYPES, HTML_TYPE
from handlers.metrics import METRICS_TYPE
from handlers.openapi.parts import closed, parameter
from handlers.operation import Operation
from handlers.operation import Response as R
from handlers.resources import DOCS, DOCS_ASSET, HEALTHZ, METRICS, OPENAPI, READYZ

_CACHED = ("ETag", "Cache-Control")
_ASSET_NOT_MODIFIED = R("`If-None-Match` matches the current ETag.", headers=_CACHED)

SERVICE_OPERATIONS: Tuple[Operation, ...] = (
    Operation(
        HEALTHZ,
        "GET",
        "getHealth",
        "Liveness",
        "health",
        None,
        {200: R("Up.", closed({"status": {"const": "ok"}}, ["status"], "The process is up."))},
        head="headHealth",
        pipeline="live",
    ),
    Operation(
        READYZ,
        "GET",
        "getReadiness",
        "Readiness",
        "health",
        None,
        {200: R("Ready.", closed({"status": {"const": "ready"}}, ["status"], "Redis answers."))},
        (503,),
        {503: "Redis does not answer in time (problem type `not-ready`)."},
        head="headReadiness",
    ),
    Operation(
        METRICS,
        "GET",
        "getMetrics",
        "Metrics",
        "meta",
        None,
        {200: R("Prometheus text format 0.0.4.", {"type": "string"}, media=METRICS_TYPE)},
        head="headMetrics",
    ),
    Operation(
        OPENAPI,
        "GET",
        "getOpenApi",
        "This document",
        "meta",
        None,
        {200: R("OK.", {"type": "object", "additionalProperties": True, "description": "This document."})},
        head="headOpenApi",
    ),
    Operation(
        DOCS,
        "GET",
        "getDocs",
        "Swagger UI over this document",
        "meta",
        None,
        {
            200: R("The page.", {"type": "string"}, ("Content-Security-Policy", *_CACHED), HTML_TYPE),
            304: _ASSET_NOT_MODIFIED,
        },
        parameters=("If-None-Match",),
        head="headDocs",
    ),
    Operation(
        DOCS_ASSET,
        "GET",
        "getDocsAsset",
        "A script or style of the /docs page",
        "meta",
        None,
        {
            200: R(
                "The file; `Cache-Control` says a year when `v` is its current version.",
                headers=_CACHED,
                content={media: {"schema": {"type": "string"}} for media in ASSET_TYPES},
            ),
            304: _ASSET_NOT_MODIFIED,
        },
        (404,),
        {404: "No such asset (problem type `no-route`)."},
        parameters=(
            parameter("asset", "path", "The file.", {"type": "string", "enum": list(ASSET_NAMES)}, required=True),
            parameter("v", "query", "The asset's version, as the page names it.", {"type": "string"}),
            "If-None-Match",
        ),
        head="headDocsAsset",
    ),
)
