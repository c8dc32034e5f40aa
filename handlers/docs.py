"""``/docs``: Swagger UI over ``/openapi.json``, from a packaged copy, never a CDN.

Swagger UI's script and style come from the ``swagger-ui-bundle-v2`` package
(the connexion maintainers' Swagger UI 5; their ``swagger-ui-bundle`` ships
4.15, which cannot render OpenAPI 3.1). They are read once per process and
served beside the page and its own start-up script, so the page works with no
network, and its Content-Security-Policy lets the browser load nothing from
anywhere else. Each asset is named in the page with its content hash: a
browser keeps it for a year (``immutable``) and still fetches a new one the
moment the page names it. The page itself is revalidated on every visit.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

from swagger_ui_bundle import swagger_ui_path

from handlers.base import JsonHandler
from handlers.http import validation
from handlers.http.errors import ApiError
from handlers.paths import DOCS_ASSETS, OPENAPI

HTML_TYPE = "text/html; charset=utf-8"

# Every part is there for something the page does; everything else is refused.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",  # nothing that is not allowed below
        "script-src 'self'",  # the bundle and the start-up script; no inline script, no eval
        # Swagger UI 5 sets its styles through the DOM (which the policy does
        # not govern) and adds no <style> element: no 'unsafe-inline' needed
        # (tests/handlers/test_docs.py watches for refusals while it uses the page).
        "style-src 'self'",
        "img-src 'self' data:",  # the stylesheet's icons are data: URIs
        "connect-src 'self'",  # /openapi.json and "Try it out", this origin only
        "base-uri 'none'",  # no injected <base> can move the page's relative URLs
        "form-action 'none'",  # the Authorize dialog's form is handled by script, never submitted
        "frame-ancestors 'none'",  # a page that takes a token is not framed by another site
    )
)
# The stored assets change only with the package: a year, never revalidated.
IMMUTABLE = "public, max-age=31536000, immutable"
# Asked for without the current hash (an old page, a hand-typed URL): revalidate.
REVALIDATE = "no-cache"

# What the page runs once the bundle is loaded. A file, not an inline script,
# so that the policy needs no 'unsafe-inline' for scripts.
START_SCRIPT = b"""\
"use strict";
window.ui = SwaggerUIBundle({
  url: "%s",
  dom_id: "#swagger-ui",
  deepLinking: true,
  // Never send the document to validator.swagger.io for a badge.
  validatorUrl: null,
  // The page cannot be pointed at another document by its query string.
  queryConfigEnabled: false,
  // The token stays in the page's memory, never in localStorage.
  persistAuthorization: false,
  displayRequestDuration: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
""" % OPENAPI.encode("ascii")

_PAGE = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Jetway API</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{css}">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{bundle}"></script>
<script src="{start}"></script>
</body>
</html>
"""

_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
ASSET_TYPES = tuple(_TYPES.values())
# The two files of the package the page needs (most of the package's bytes are
# source maps), and the page's own start-up script.
PACKAGED = ("swagger-ui-bundle.js", "swagger-ui.css")
START = "start.js"
ASSET_NAMES = (*PACKAGED, START)


@dataclass(frozen=True)
class Asset:
    """One file, as sent: its bytes, their gzip, and a validator from its content."""

    body: bytes
    gzipped: bytes
    content_type: str
    etag: str

    @classmethod
    def of(cls, body: bytes, content_type: str) -> Asset:
        digest = hashlib.sha256(body).hexdigest()[:16]
        # mtime=0: the same bytes in every worker, so any worker may answer a revalidation.
        return cls(body, gzip.compress(body, 6, mtime=0), content_type, f'"{digest}"')

    @property
    def version(self) -> str:
        return self.etag.strip('"')


class DocsSite:
    """The page and its assets, built once per process (``packaged_site``)."""

    def __init__(self, assets: Dict[str, Asset]) -> None:
        self.assets = assets
        urls = {name: f"{DOCS_ASSETS}{name}?v={asset.version}" for name, asset in assets.items()}
        page = _PAGE.format(css=urls["swagger-ui.css"], bundle=urls["swagger-ui-bundle.js"], start=urls[START])
        self.page = Asset.of(page.encode(), HTML_TYPE)

    @classmethod
    def load(cls) -> DocsSite:
        """The packaged Swagger UI and the start-up script."""
        assets = {name: Asset.of((swagger_ui_path / name).read_bytes(), _TYPES[Path(name).suffix]) for name in PACKAGED}
        assets[START] = Asset.of(START_SCRIPT, _TYPES[".js"])
        return cls(assets)


@functools.cache
def packaged_site() -> DocsSite:
    """``DocsSite.load()``, once per process, when the page or an asset is first asked for.

    Not as the worker starts: the bundle and its gzip are megabytes of a
    PyPy worker's heap, more of its resident memory with the major
    collection's threshold over it, that most workers never send, against
    issue 7's 150 MB. The first request for them waits for the load
    (docs/configuration.md, "Configuration (environment)": ``JETWAY_DOCS``).
    """
    return DocsSite.load()


def accepts_gzip(header: Optional[str]) -> bool:
    """Whether ``Accept-Encoding`` names gzip with a quality above 0."""
    for part in (header or "").split(","):
        coding, *params = [item.strip().lower() for item in part.split(";")]
        if coding in ("gzip", "x-gzip"):
            quality = next((param[2:] for param in params if param.startswith("q=")), "1")
            try:
                return float(quality) > 0
            except ValueError:
                return False
    return False


class _StaticHandler(JsonHandler):
    def initialize(self, site: Callable[[], DocsSite]) -> None:
        self.site = site()

    def send_asset(self, asset: Asset, cache_control: str) -> None:
        """``asset`` (gzipped when the client takes it), or 304 when the client has it."""
        self.set_header("ETag", asset.etag)
        self.set_header("Cache-Control", cache_control)
        self.set_header("Vary", "Accept-Encoding")
        self.set_header("X-Content-Type-Options", "nosniff")
        held = validation.entity_tags(self.request.headers.get("If-None-Match"), weak=True)
        if held == b"*" or asset.etag.encode() in held.split():
            self.set_status(304)
            return
        body = asset.body
        if accepts_gzip(self.request.headers.get("Accept-Encoding")):
            self.set_header("Content-Encoding", "gzip")
            body = asset.gzipped
        self.send_bytes(200, body, asset.content_type)


class DocsPageHandler(_StaticHandler):
    """The page: Swagger UI's shell, pointed at ``/openapi.json``."""

    ROUTE = "docs"

    def get(self) -> None:
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Referrer-Policy", "no-referrer")
        self.send_asset(self.site.page, REVALIDATE)

    head = get


class DocsAssetHandler(_StaticHandler):
    """``/docs/assets/{name}``: Swagger UI's script and style, and the page's start-up script."""

    ROUTE = "docs-asset"

    def get(self, name: str) -> None:
        asset = self.site.assets.get(name)
        if asset is None:
            raise ApiError(404, "no-route", f"no resource at {self.request.path}")
        current = self.query_arguments("v") == [asset.version]
        self.send_asset(asset, IMMUTABLE if current else REVALIDATE)

    head = get
