"""Every path template of the API, written once, in OpenAPI form (``{name}`` for a segment).

The operation table (``handlers.operations``) routes by them and
``/openapi.json`` lists them; a module that must name a path for another
reason (the connection's larger body limit for batches, the /docs page's
asset links) imports it from here, so no template is written twice.
"""

from __future__ import annotations

DOCUMENT = "/v1/{collection}/{id}"
COLLECTION = "/v1/{collection}"
MULTI_GET = "/v1/_get/{collection}"
BATCH = "/v1/_batch"
CHANGES = "/v1/_changes/{collection}"
TICKETS = "/v1/_changes/{collection}/tickets"
SETTINGS = "/v1/_collections/{collection}"
SETTINGS_LIST = "/v1/_collections"
HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"
OPENAPI = "/openapi.json"
DOCS = "/docs"
DOCS_ASSETS = "/docs/assets/"
DOCS_ASSET = DOCS_ASSETS + "{asset}"
IMPORT = "/v1/_import/{collection}"
