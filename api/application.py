"""The Cyclone application every worker serves: its connections, their deadlines, its limits.

It keeps the open connections (for draining and the deadline sweep), the
worker's body budget, and stops accepting at ``max_connections``.
"""

from __future__ import annotations

import email.utils
from typing import Any, List, Optional, Sequence, Set, Tuple

import cyclone.web
from cyclone.escape import url_unescape
from cyclone.web import URLSpec
from twisted.internet import task
from twisted.logger import Logger

from api.body_budget import STREAM_SHARE, BodyBudget
from api.connection import HttpLimits, JetwayConnection
from api.counted_ids import CountedIds
from api.observe import Observer
from api.routed import Routed
from api.streamed_body import stream_reservation
from handlers.http.cors import NO_CORS, CorsPolicy
from handlers.http.reply import request_id_of
from handlers.operation import Route
from handlers.pipeline import Exchange, Pipeline

# How often the application looks for connections past their deadline, so a
# timeout fires at most this late. One sweep replaces a Twisted timer made
# and cancelled twice per request, whose heap work vmprof found on every
# document read (docs/history/performance.md, "The changes, in the order done").
DEADLINE_TICK = 0.25

_log = Logger()


class JetwayApplication(cyclone.web.Application):
    """Cyclone's application, speaking through ``JetwayConnection``.

    It keeps the open connections (for draining) and stops accepting while
    ``max_connections`` are open, instead of running out of descriptors.
    """

    protocol = JetwayConnection
    # JETWAY_DEBUG_BURN_US in seconds (api/debug_burn.py); 0 in production.
    debug_burn_seconds = 0.0
    # Whether the connection runs an operation's pipeline itself (JETWAY_DIRECT_ANSWERS); make_app sets it.
    direct_answers = False
    # The browser origins allowed (JETWAY_CORS_ORIGINS); make_app sets it.
    cors: CorsPolicy = NO_CORS
    # The worker's tracing (api.tracing.Tracing), started by listen_on with start_tracing (make_app sets it when
    # JETWAY_TRACING_ENDPOINT is): a warm-up's throwaway application, which never listens, traces nothing.
    tracing: Any = None
    start_tracing: Any = None

    def __init__(self, handlers: Any, clock: Any, limits: HttpLimits, observer: Observer, **settings: Any) -> None:
        # No output transforms: every response has a Content-Length, so
        # Cyclone's chunking transform (made anew per request) never applies.
        super().__init__(handlers, transforms=[], log_function=observer.request_finished, **settings)
        self.clock = clock
        self.limits = limits
        self.observer = observer
        # Streamed bodies get a share of the budget, room for one of them at least.
        streams = max(int(limits.body_budget * STREAM_SHARE), stream_reservation(limits.max_body))
        self.body_budget = BodyBudget(limits.body_budget, min(limits.body_budget, streams))
        self.connections: Set[JetwayConnection] = set()
        self.port: Any = None
        self._date: Tuple[int, str] = (0, "")
        # Request ids: unique per worker by a random prefix, then counted;
        # a uuid4 per request reads /dev/urandom: too dear for every request.
        self._request_ids = CountedIds()
        self.accepting = True
        self._paused = False
        self._sweeping = task.LoopingCall(self._time_out_connections)
        self._sweeping.clock = clock
        # Every route, in order; each matches a path by its template (handlers.operation.Route).
        self._routes: List[Route] = [spec for _, specs in self.handlers for spec in specs]

    def __call__(self, request: Any) -> Any:
        """Cyclone's dispatch, by the routes' templates (``route``).

        No route, the ``error_handler``'s 404. A request the connection
        routed already (``api.connection.Routed``) is not routed again.
        """
        routed = getattr(request, "routed", None)
        spec, args = (routed.spec, routed.args) if routed is not None else self.route(request.path)
        if spec is None:
            handler = self.error_handler(self, request, status_code=404)
        else:
            handler = spec.handler_class(self, request, **spec.kwargs)
        handler.execute(*args)
        return handler

    def pipeline_of(self, spec: Optional[URLSpec], method: str) -> Optional[Pipeline]:
        """The pipeline ``spec``'s handler declares for ``method``, if any, which the connection may run itself.

        The operation table names an operation's pipeline, and its route's
        arguments carry it bound (``pipelines``, ``handlers.operation.routes``);
        the handler runs the same ones for what the connection leaves it.
        """
        pipelines = spec.kwargs.get("pipelines") if spec is not None else None
        return pipelines.get(method) if pipelines is not None else None

    def exchange(self, method: str, routed: Routed, headers: Any, body: bytes) -> Exchange:
        """The request as a pipeline sees it, with its id (the client's ``X-Request-ID`` if sane)."""
        request_id = request_id_of(headers.get("X-Request-ID"), self.new_request_id)
        exchange = Exchange(method, routed.path, routed.query, routed.args, headers, body, request_id, routed.scope)
        if self.tracing is not None:
            operation = routed.operation  # a request with a pipeline has an operation
            template = operation.path if operation is not None else routed.path
            exchange.trace = self.tracing.begin(method, template, routed.path, headers, request_id, operation)
        return exchange

    def route_request(self, method: str, target: str) -> Routed:
        """The route of a request, found at its head, with what its operation declares (``Routed``)."""
        path, _, query = target.partition("?")
        spec, args = self.route(path)
        if spec is None:
            return Routed(None, args, path, query)
        operation = spec.operations.get(method)  # type: ignore[attr-defined]  # a Route (handlers.operation)
        return Routed(spec, args, path, query, operation, self.pipeline_of(spec, method))

    def route(self, path: str) -> Tuple[Optional[URLSpec], Sequence[Optional[str]]]:
        """The route that serves ``path`` and the arguments its handler gets (None and none: no route).

        The first route whose template matches wins, its arguments unquoted
        as Cyclone does. Cyclone matched the path against every route's
        regex in turn, and the host against a catch-all pattern: a visible
        share of a hot document read's worker CPU (vmprof; docs/history/performance.md,
        "The changes, in the order done").
        """
        for spec in self._routes:
            found = spec.arguments(path)
            if found is not None:
                if "%" not in path and "+" not in path:
                    return spec, found  # nothing to unescape: no string nor list made anew
                return spec, [_unquote(group) for group in found]
        return None, []

    def http_date(self) -> str:
        """The current HTTP date, formatted once per second rather than per response."""
        second = int(self.clock.seconds())
        if self._date[0] != second:
            self._date = (second, email.utils.formatdate(second, usegmt=True))
        return self._date[1]

    def new_request_id(self) -> str:
        """32 hex digits, unique across workers and restarts, for a request that came without one."""
        return self._request_ids.new()

    def listen_on(self, port: Any) -> None:
        self.port = port
        if self.start_tracing is not None and self.tracing is None:
            self.tracing = self.start_tracing()
        if not self._sweeping.running:
            self._sweeping.start(DEADLINE_TICK, now=False)

    def _time_out_connections(self) -> None:
        now = self.clock.seconds()
        for connection in list(self.connections):  # a timeout may close one
            try:
                connection.check_deadline(now)
            except Exception:
                # An error escaping the sweep would stop it, and with it
                # every timeout of this worker: log it and go on.
                _log.failure("while timing out a connection")

    def stop_accepting(self) -> None:
        self.accepting = False

    def connection_opened(self, connection: JetwayConnection) -> None:
        self.connections.add(connection)
        self.observer.connection_opened()
        if len(self.connections) >= self.limits.max_connections and self.port is not None and not self._paused:
            self._paused = True
            self.port.stopReading()

    def connection_closed(self, connection: JetwayConnection) -> None:
        self.connections.discard(connection)
        self.observer.connection_closed()
        if self._paused and len(self.connections) < self.limits.max_connections:
            self._paused = False
            if self.accepting:
                self.port.startReading()


def _unquote(group: Optional[str]) -> Optional[str]:
    return None if group is None else url_unescape(group)
