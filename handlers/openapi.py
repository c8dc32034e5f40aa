"""``/openapi.json``: the OpenAPI 3.1 description of the API."""

from __future__ import annotations

from typing import Any, Dict

from cache import codec
from handlers.base import JsonHandler


def openapi_document() -> Dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "Jetway", "version": "1"}, "paths": {}}


class OpenApiHandler(JsonHandler):
    # Serialized once per process: the document never changes while serving.
    _body = codec.dumps(openapi_document())

    def get(self) -> None:
        self.send_bytes(200, self._body)

    head = get
