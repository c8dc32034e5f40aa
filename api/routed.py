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

from handlers.operation import DOCUMENT_BODY, Operation


class Routed:
    """A request's route (None: no route), its arguments and its operation (None: none declared for its method),
    as found at its head.

    Cyclone's dispatch (``api.application.JetwayApplication.__call__``)
    takes them and does not route the request again. ``pipeline``: the one
    the connection may run itself. How the body is read (``intake``) and the
    scope a token needs are the operation's, read from it, not copied.
    """

    __slots__ = ("args", "operation", "path", "pipeline", "query", "spec")

    def __init__(
        self,
        spec: Optional[URLSpec],
        args: Sequence[Any],
        path: str = "",
        query: str = "",
        operation: Optional[Operation] = None,
        pipeline: Optional[Any] = None,
    ) -> None:
        self.spec = spec
        self.args = args
        self.path = path
        self.query = query
        self.operation = operation
        self.pipeline = pipeline

    @property
    def intake(self) -> str:
        return self.operation.intake if self.operation is not None else DOCUMENT_BODY

    @property
    def scope(self) -> Optional[str]:
        """What a token needs (no operation declared: the strictest)."""
        return self.operation.scope if self.operation is not None else "admin"
