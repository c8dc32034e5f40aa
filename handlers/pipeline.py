"""An operation's pipeline: its steps, run at once when nothing waits, in one piece of code.

A pipeline takes an ``Exchange`` (the request, as its steps see it) and
gives a ``Reply``, or a Deferred of one. Each step returns a value, or a
Deferred when it has to wait (a token or settings not known in memory, a
document read from Redis); ``then`` calls the next step on a value at once
and chains it on a Deferred, so a request whose every step had its value
(token and settings known, a hot-cache hit) is answered without one
Deferred made.

The same pipeline runs two ways (``run`` gives its reply, never a failure):

- the connection runs it before any Cyclone object is made and sends the
  reply itself (``api.connection``): the fast path, for a request on a
  connection that stays open;
- the operation's Cyclone handler runs it (``handlers.operations_handler``)
  for any other request (HTTP/1.0, ``Connection: close``, a draining worker,
  or the direct answers turned off) and sends the same reply through
  Cyclone, adding only the ``Connection`` header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple, Union
from urllib.parse import parse_qs

from twisted.internet import defer
from twisted.python.failure import Failure

from cache.credentials.ratelimit import RateDecision
from cache.trace_scope import active, resuming_within, run_within
from handlers.http.auth import Grant
from handlers.http.deferreds import is_deferred
from handlers.http.errors import bad_request
from handlers.http.problems import problem_of, problem_reply, rate_limited
from handlers.http.reply import Reply

Step = Union[Reply, defer.Deferred]
Pipeline = Callable[["Exchange"], Step]


@dataclass(eq=False)
class Exchange:
    """One request as a pipeline's steps see it, whoever received it.

    ``args``: the path's arguments, unescaped, as the route matched them.
    ``rate_headers``: the token's rate headers, once its rate step is
    decided; every reply carries them, an error's too. ``scope``: what its
    operation declares a token needs (the operation table's), which the
    pipeline's admission step asks for.
    """

    method: str
    path: str
    query: str
    args: Sequence[str]
    headers: Any
    body: bytes
    request_id: str
    scope: str = "write"
    rate_headers: Iterable[Tuple[str, str]] = ()
    grant: Optional[Grant] = None  # once admitted: who asks (a collection's owner rule reads it)
    trace: Any = None  # its span (api.tracing.RequestTrace) when tracing is on

    def admit(self, grant: Grant) -> Grant:
        """Take ``grant``'s rate decision (if any): its headers, or the 429 it makes."""
        self.grant = grant
        self.apply_rate(grant.rate)
        return grant

    def apply_rate(self, rate: Optional[RateDecision]) -> None:
        if rate is None:
            return
        self.rate_headers = rate.headers()
        if not rate.allowed:
            raise rate_limited(rate)

    def query_argument(self, name: str) -> Optional[str]:
        """A query parameter given at most once (blank counts as given); None when not given."""
        return query_argument(self.query, name)


def query_argument(query: str, name: str) -> Optional[str]:
    """``name``'s value in the query string ``query``: at most once (blank counts as given), else a 400."""
    if not query:
        return None
    values = parse_qs(query, keep_blank_values=True).get(name)
    if not values:
        return None
    if len(values) > 1:
        raise bad_request(f"{name} may be given only once", f"invalid-{name}")
    return values[0]


def then(value: Any, step: Callable[..., Any], *args: Any) -> Any:
    """``step(value, *args)`` now when ``value`` is at hand, else once its Deferred fires."""
    if is_deferred(value):
        # Resumed with the trace active now (cache.trace_scope: whoever fires it may be another request).
        return value.addCallback(resuming_within(active(), step), *args)
    return step(value, *args)


def both(first: Any, second: Any, step: Callable[..., Any], *args: Any) -> Any:
    """``step(first, second, *args)`` once both are at hand; ``second`` runs alongside, not after.

    When ``first`` fails, its failure is the answer and ``second``'s own
    failure (if any) is not logged as unhandled.
    """
    if not is_deferred(first):
        if not is_deferred(second):
            return step(first, second, *args)  # the usual read: settings known, a hot-cache hit
        step = resuming_within(active(), step)  # as in then
        return second.addCallback(lambda value: step(first, value, *args))
    step = resuming_within(active(), step)
    if not is_deferred(second):
        return first.addCallback(step, second, *args)
    return first.addCallbacks(
        lambda value: second.addCallback(lambda later: step(value, later, *args)),
        lambda failure: _dropping(failure, second),
    )


def _dropping(failure: Failure, other: defer.Deferred) -> Failure:
    other.addErrback(lambda _: None)
    return failure


def run(pipeline: Pipeline, exchange: Exchange) -> Step:
    """``pipeline``'s reply to ``exchange``, or a Deferred of it that never fails (a failure is its problem's)."""
    reply = start(pipeline, exchange)
    if is_deferred(reply):
        return reply.addErrback(failed, exchange)
    return reply


def start(pipeline: Pipeline, exchange: Exchange) -> Step:
    """``pipeline``'s reply now (an error raised now is its problem's), or its Deferred as it is: it may fail.

    For a caller that adds its own callback and errback in one link of the
    chain (the connection: every link is a step of ``_runCallbacks``).
    """
    trace = exchange.trace
    try:
        # A traced request's steps run with its trace active, only if it is sampled (else nothing records): a
        # context variable set and reset costs PyPy more than the rest of the unsampled trace (docs/tracing.md,
        # "What it costs"). Its ``traceparent`` is the head's (``Reply.head``).
        if trace is not None and trace.recording:
            return run_within(trace, pipeline, exchange)
        return pipeline(exchange)
    except Exception:
        return failed(Failure(), exchange)


def failed(failure: Failure, exchange: Exchange) -> Reply:
    """The reply to a request a step failed: its problem, with the rate headers decided before (and its trace)."""
    return problem_reply(
        problem_of(failure, exchange.method, exchange.path), exchange.rate_headers, trace=exchange.trace
    )
