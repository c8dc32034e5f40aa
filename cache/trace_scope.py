"""Which request's trace the code running now works for, so that a Redis call is recorded under it.

A request's trace (``api.tracing.RequestTrace``) is active while its code
runs: the connection or the handler makes it active around the request's
first steps, and every point where the request resumes after a wait makes
it active again. Python's ``contextvars`` alone do not do that under
Twisted: ``inlineCallbacks`` runs its generator in a copy of the context it
was called in (so a handler's generator keeps its request's trace), but a
plain Deferred's callbacks run in the context of whatever fired it: the
Redis connection's ``dataReceived``, or another request's code that filled
a shared cache. So the resumption points bind the trace explicitly:
``MeteredLink`` fires a call's continuation with the caller's trace active,
and the pipelines' ``then``/``both`` and the handlers' ``prepare`` resume
with the trace that was active when they began to wait
(``tests/tracing/test_scope.py`` checks both across real Deferred hops).

Nothing here knows the tracing library; with tracing off nothing is ever
made active and ``active()`` is one context-variable read (docs/tracing.md,
"What it costs").
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Mapping, Optional, Protocol, TypeVar

T = TypeVar("T")


class Traced(Protocol):
    """A traced request as the Redis layer records its calls into it (and the change feed names it by)."""

    traceparent: str

    def redis_call(
        self, name: str, started_ns: int, ended_ns: int, error: Optional[BaseException], attributes: Mapping[str, Any]
    ) -> None: ...


# The trace of the request whose code runs now; None: none (tracing off, or a request not sampled).
_ACTIVE: ContextVar[Optional[Traced]] = ContextVar("jetway_active_trace", default=None)
# Set, so that the reactor's context and every copy of it hold the variable: on PyPy, reading a variable that a
# context lacks raises and catches a KeyError inside _contextvars, and the JIT builds the frames it kept virtual
# (docs/tracing.md, "What it costs"). Once anything made the context (a sampled request, an inlineCallbacks
# handler), every read after it paid that.
_ACTIVE.set(None)


def active() -> Optional[Traced]:
    """The trace of the request whose code runs now, if any."""
    return _ACTIVE.get()


def run_within(trace: Optional[Traced], function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` with ``trace`` active (None: none), the one active before restored after."""
    token = _ACTIVE.set(trace)
    try:
        return function(*args)
    finally:
        _ACTIVE.reset(token)


def resuming_within(trace: Optional[Traced], function: Callable[..., T]) -> Callable[..., T]:
    """``function``, to be called later (a Deferred's callback) with ``trace`` active; itself when ``trace`` is None."""
    if trace is None:
        return function
    return lambda *args: run_within(trace, function, *args)
