"""The handler of ``/openapi.json``: it sends the bytes its source keeps (``handlers.openapi.collections``).

It imports nothing that builds the document: the operation table imports
this handler, and the generator must not import the table.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from handlers.base import JsonHandler


class OpenApiHandler(JsonHandler):
    ROUTE = "openapi"

    def initialize(self, source: Any) -> None:
        # handlers.openapi.collections.OpenApiSource: serialized once, again only after a settings change.
        self.source = source

    def get(self) -> defer.Deferred:
        return self.source.body().addCallback(self._send)

    def _send(self, body: bytes) -> None:
        self.send_bytes(200, body)

    head = get
