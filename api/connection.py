"""Jetway's HTTP connection: Cyclone's, plus what a graceful drain needs.

The application keeps the set of open connections; each connection knows
whether it holds a request and since when it has been idle, so a draining
worker can close idle keep-alive connections and let busy ones finish their
response (sent with ``Connection: close``).
"""

from __future__ import annotations

from typing import Any, Set

import cyclone.httpserver
import cyclone.web


class JetwayConnection(cyclone.httpserver.HTTPConnection):
    """One client connection; registered with the application while open."""

    factory: JetwayApplication

    def connectionMade(self) -> None:
        super().connectionMade()
        self.closing = False
        self.idle_since = self.factory.clock.seconds()
        self.factory.connections.add(self)

    def connectionLost(self, reason: Any) -> None:
        self.factory.connections.discard(self)
        super().connectionLost(reason)

    def busy(self) -> bool:
        """A request is being received or answered on this connection."""
        return self._request is not None or bool(self._headersbuffer)

    def _finish_request(self) -> None:
        if self.closing:
            self.no_keep_alive = True
        super()._finish_request()
        self.idle_since = self.factory.clock.seconds()


class JetwayApplication(cyclone.web.Application):
    """Cyclone's application, speaking through ``JetwayConnection``."""

    protocol = JetwayConnection

    def __init__(self, handlers: Any, clock: Any, **settings: Any) -> None:
        super().__init__(handlers, **settings)
        self.clock = clock
        self.connections: Set[JetwayConnection] = set()
