"""What an operation of the API is: the records the operation table is written in.

``handlers.operations`` declares every operation once with these; Cyclone's
routes and ``/openapi.json`` (``handlers.openapi``) are derived from them.
This module imports no handler, so the document's generator can read the
records without importing the table (which imports every handler, the
OpenAPI one included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from cyclone.web import URLSpec

Json = Dict[str, Any]
JSON_TYPE = "application/json"

# How an operation takes its request body, which the connection reads from the operation it routed to: whole,
# up to JETWAY_MAX_BODY (a document's) or JETWAY_MAX_BATCH_BYTES (a batch's); or streamed to its handler as it
# arrives (an import's, of any length: api.streamed_body).
DOCUMENT_BODY, BATCH_BODY, STREAMED_BODY = "document", "batch", "streamed"

# The segment a template's ``{name}`` matches: loosely, so that the handler
# checks it and a bad collection name or id is a 400 that says why, not a 404.
SEGMENT = r"([^/]+)"
# A template's ``{name}``.
_NAME = r"\{[^}/]+\}"


@dataclass(frozen=True)
class Response:
    """One documented answer: a component schema's name or an inline schema, the headers it carries."""

    description: str
    schema: Union[None, str, Json] = None
    headers: Tuple[str, ...] = ()
    media: str = JSON_TYPE
    content: Optional[Json] = None  # several media types at once: the whole ``content`` member
    optional: Tuple[str, ...] = ()  # of ``headers``, those this answer does not always carry


@dataclass(frozen=True)
class Body:
    """A request body: its media type, and the component schema it must match."""

    media: str
    description: str
    schema: str


@dataclass(frozen=True)
class Resource:
    """A path: its template, the handler Cyclone routes it to, what the document says of it."""

    template: str
    handler: type
    description: str
    name: str  # the OPTIONS operation's id is ``options<name>``
    parameters: Tuple[str, ...] = ()  # component parameters shared by its operations (its path's)
    slash: bool = False  # a trailing slash is accepted
    with_docs: bool = False  # routed and documented only while /docs is on (JETWAY_DOCS)

    @property
    def pattern(self) -> str:
        """The route's regex: each ``{name}`` a loose segment, the rest literal."""
        parts = re.split(_NAME, self.template)
        return SEGMENT.join(re.escape(part).replace(r"\/", "/") for part in parts) + ("/?" if self.slash else "")


@dataclass(frozen=True)
class Operation:
    """One method on one path, declared once: how it is routed, admitted and documented.

    ``scope`` is what a token needs: ``None`` (no token), ``"token"`` (any valid
    token; a batch checks each of its operations' scope), ``"read"``,
    ``"write"`` or ``"admin"``; the handlers' one admission
    (``handlers.base.ResourceHandler.prepare``), the pipelines' and
    ``/openapi.json``'s ``security`` read it. ``intake`` is how its body is
    read (``DOCUMENT_BODY``, ``BATCH_BODY``, ``STREAMED_BODY``). ``errors`` are the problem statuses it may
    answer (``details`` rewords the shared description of one), and
    ``replicated`` the headers of a write's 503 ``not-replicated``. A ``GET``
    with ``head`` has a ``HEAD`` of that id derived from it.
    """

    resource: Resource
    method: str
    operation_id: str
    summary: str
    tag: str
    scope: Optional[str]
    responses: Mapping[int, Response]
    errors: Tuple[int, ...] = ()
    details: Mapping[int, str] = field(default_factory=dict)
    replicated: Optional[Tuple[str, ...]] = None
    parameters: Tuple[Union[str, Json], ...] = ()  # component names, or a parameter written out
    body: Optional[Body] = None
    head: Optional[str] = None
    security: Tuple[str, ...] = ("bearer",)
    # The pipeline that answers it (handlers/pipeline.py): the name of a method of its handler's
    # ``answers`` (``handlers.document_answers.DocumentAnswers.read``), which the connection runs
    # itself and the handler runs for what the connection leaves it.
    pipeline: Optional[str] = None
    intake: str = DOCUMENT_BODY

    @property
    def path(self) -> str:
        return self.resource.template


class Route(URLSpec):
    """Cyclone's route to one resource, which also matches a path by its template's text, with no regex.

    ``arguments`` gives what the route's regex would (a dispatch by regex
    was a visible share of a hot document read's worker CPU under vmprof;
    docs/history/performance.md, "The changes, in the order done"): each segment runs
    to the next slash, and every literal after one starts with a slash (the
    constructor checks it), so finding the slashes is the whole match.
    """

    def __init__(
        self, resource: Resource, kwargs: Optional[Dict[str, Any]], operations: Mapping[str, Operation] = {}
    ) -> None:
        super().__init__(resource.pattern, resource.handler, kwargs)
        # Each method's operation (a GET's HEAD too): what the connection and the handler read of it.
        self.operations = dict(operations)
        self.pattern = resource.pattern  # as the resource wrote it (Cyclone's regex has a ``$`` added)
        literals = re.split(_NAME, resource.template)
        if any(not literal.startswith("/") for literal in literals[1:-1]) or literals[-1][:1] not in ("", "/"):
            raise ValueError(f"{resource.template}: a segment must end at a slash or at the end")
        self._first = literals[0]
        self._after_segments = tuple(literals[1:])
        self._slash = resource.slash

    def arguments(self, path: str) -> Optional[Tuple[str, ...]]:
        """The segments ``path`` gives the template's names, as the route's regex's groups; None: no match."""
        if not path.startswith(self._first):
            return None
        position, end = len(self._first), len(path)
        if self._slash and end > position and path.endswith("/"):
            end -= 1  # the one trailing slash the route accepts
        found: List[str] = []
        for literal in self._after_segments:
            stop = path.find("/", position, end) if literal else end
            if stop <= position or (not literal and path.find("/", position, end) >= 0):
                return None  # an empty segment, or a slash where the template has none
            if literal and not path.startswith(literal, stop, end):
                return None
            found.append(path[position:stop])
            position = stop + len(literal)
        return tuple(found) if position == end else None


def routes(
    operations: Iterable[Operation], kwargs: Mapping[type, Dict[str, Any]], with_docs: bool = True
) -> List[Route]:
    """Cyclone's routes: one per path, in the order the table first names it.

    ``kwargs`` are each handler's dependencies (its ``initialize`` arguments);
    the /docs paths are left out unless ``with_docs``.
    """
    operations = list(operations)
    paths: Dict[Resource, None] = dict.fromkeys(operation.resource for operation in operations)
    return [
        Route(
            resource,
            _with_operations(kwargs.get(resource.handler), resource, operations),
            _by_method(resource, operations),
        )
        for resource in paths
        if with_docs or not resource.with_docs
    ]


def _by_method(resource: Resource, operations: List[Operation]) -> Dict[str, Operation]:
    """The resource's operations by method; a GET's HEAD is the GET's."""
    found: Dict[str, Operation] = {}
    for operation in operations:
        if operation.resource is resource:
            found[operation.method] = operation
            if operation.head is not None:
                found["HEAD"] = operation
    return found


def _with_operations(
    kwargs: Optional[Dict[str, Any]], resource: Resource, operations: List[Operation]
) -> Optional[Dict[str, Any]]:
    """The handler's arguments, with ``operations`` (each method's) and ``pipelines``: each method's pipeline,
    bound to its ``answers``, if any."""
    if kwargs is None:
        return None  # the table's routes alone, as its tests read them
    by_method = _by_method(resource, operations)
    # Cyclone's 405 and the Allow header read SUPPORTED_METHODS: the table's methods, so no handler repeats them.
    kwargs = {**kwargs, "operations": by_method, "methods": (*by_method, "OPTIONS")}
    answers = kwargs.get("answers")
    if answers is None:
        return kwargs
    pipelines: Dict[str, Callable[..., Any]] = {}
    for operation in operations:
        if operation.resource is resource and operation.pipeline is not None:
            answer = getattr(answers, operation.pipeline)
            pipelines[operation.method] = answer
            if operation.head is not None:
                pipelines["HEAD"] = answer
    return kwargs if not pipelines else {**kwargs, "pipelines": pipelines}
