"""The server process: one reactor, one Redis pool, the app on a port."""

from __future__ import annotations

import sys
from typing import Any

from twisted.internet import defer
from twisted.logger import globalLogBeginner, textFileLogObserver

from api.app import make_app
from api.config import Settings
from cache.link import RedisLink
from cache.store import DocumentStore


def serve(settings: Settings, reactor: Any) -> int:
    """Listen on ``settings.host:port`` and serve until stopped."""
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)], redirectStandardIO=False)
    link = RedisLink(settings.redis, reactor, settings.redis_timeout, settings.redis_pool)
    app = make_app(settings, DocumentStore(link), reactor)
    port = reactor.listenTCP(settings.port, app, interface=settings.host)
    print(f"jetway: serving on http://{_url_host(settings.host)}:{port.getHost().port}", flush=True)
    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: defer.DeferredList([port.stopListening(), link.close()])
    )
    reactor.run()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
