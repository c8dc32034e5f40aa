"""A request's route as the connection finds it at the request's head: once, for every step after.

The connection reads the body as the route's operation declares it
(``handlers.operation``: a document's limit, a batch's, or streamed), runs
its pipeline itself where it has one, or hands the request to Cyclone,
whose dispatch (``api.application.JetwayApplication.__call__``) takes the
route as found.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from cyclone.web import URLSpec

from handlers.operation import DOCUMENT_BODY


class Routed:
    """A request's route (None: no route), its arguments, and what its operation declares, as found at its head.

    Cyclone's dispatch (``api.application.JetwayApplication.__call__``)
    takes them and does not route the request again. ``intake``: how the
    operation takes its body (``handlers.operation``); ``pipeline``: the one
    the connection may run itself.
    """

    __slots__ = ("args", "intake", "path", "pipeline", "query", "scope", "spec")

    def __init__(
        self,
        spec: Optional[URLSpec],
        args: Sequence[Any],
        path: str = "",
        query: str = "",
        intake: str = DOCUMENT_BODY,
        pipeline: Optional[Any] = None,
        scope: Optional[str] = "admin",
    ) -> None:
        self.spec = spec
        self.args = args
        self.path = path
        self.query = query
        self.intake = intake
        self.pipeline = pipeline
        self.scope = scope  # what its operation declares a token needs (no operation: the strictest)
