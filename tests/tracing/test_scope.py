"""A request's trace stays active across Deferred hops (``cache.trace_scope``), whoever fires the Deferred.

The Redis replies of two requests arrive in one reactor turn, in the context
of the Redis connection or of another request's code: each request's next
step must still run with its own trace active, or its next Redis call would
be recorded under the wrong trace.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import pytest
from twisted.internet import defer

from cache.redis.errors import RedisUnavailable
from cache.redis.metered import MeteredLink
from cache.redis.script import Script
from cache.trace_scope import active, run_within
from handlers.pipeline import both, then


class FakeTrace:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: List[Tuple[str, Optional[str], dict]] = []

    def redis_call(self, name: str, started_ns: int, ended_ns: int, error: Any, attributes: Any) -> None:
        assert started_ns <= ended_ns
        self.calls.append((name, None if error is None else type(error).__name__, dict(attributes)))

    def __repr__(self) -> str:
        return self.name


class HeldLink:
    """A link whose calls wait until the test answers them."""

    def __init__(self) -> None:
        self.pending: List[defer.Deferred] = []

    def _held(self, *_: Any) -> defer.Deferred:
        held: defer.Deferred = defer.Deferred()
        self.pending.append(held)
        return held

    execute = pipeline = run_script = pipeline_outcomes = _held

    def run_script_waiting(self, *_: Any) -> defer.Deferred:
        return self._held()


def metered() -> Tuple[MeteredLink, HeldLink, list]:
    held, observed = HeldLink(), []
    return MeteredLink(held, lambda *seen: observed.append(seen)), held, observed


def test_nothing_is_active_outside_a_request():
    assert active() is None
    link, held, observed = metered()
    call = link.execute(b"GET", b"k")
    assert call is held.pending[0]  # untraced: the link's own Deferred, nothing added but the timing
    held.pending[0].callback(b"v")
    assert observed[0][0] == "execute" and observed[0][2] is None


def test_a_redis_call_is_recorded_in_the_trace_that_sent_it_and_resumes_it():
    """Two requests wait; their replies are fired from the other's context. Each continuation runs with its own
    trace active, and each call is recorded in the trace that sent it."""
    link, held, _ = metered()
    first, second = FakeTrace("first"), FakeTrace("second")
    seen = {}

    def send(trace: FakeTrace) -> None:
        link.execute(b"HMGET", b"k", b"b").addCallback(lambda _: seen.setdefault(trace.name, active()))

    run_within(first, send, first)
    run_within(second, send, second)
    run_within(second, held.pending[0].callback, [b"x"])  # the first's reply, fired in the second's context
    run_within(first, held.pending[1].callback, [b"y"])
    assert seen == {"first": first, "second": second}
    assert [call[0] for call in first.calls] == ["HMGET"] and [call[0] for call in second.calls] == ["HMGET"]
    assert active() is None


def test_then_and_both_resume_with_the_waiting_requests_trace():
    """A pipeline's step after a wait runs with its request's trace, whoever fired the wait (a shared fill)."""
    mine, other = FakeTrace("mine"), FakeTrace("other")
    shared: defer.Deferred = defer.Deferred()
    steps: List[Any] = []
    run_within(mine, lambda: then(shared, lambda value: steps.append(("then", active()))))
    second: defer.Deferred = defer.Deferred()
    run_within(mine, lambda: both("known", second, lambda a, b: steps.append(("both", active()))))
    run_within(other, shared.callback, 1)
    run_within(other, second.callback, 2)
    assert steps == [("then", mine), ("both", mine)]


def test_inline_callbacks_keep_the_trace_they_were_called_in():
    """What the handlers' generators rely on: Twisted runs each in a copy of the context it was called in."""
    mine, other = FakeTrace("mine"), FakeTrace("other")
    reply: defer.Deferred = defer.Deferred()
    resumed: List[Any] = []

    @defer.inlineCallbacks
    def handler() -> Any:
        yield reply
        resumed.append(active())

    run_within(mine, handler)
    run_within(other, reply.callback, None)
    assert resumed == [mine]


def test_a_failed_call_is_recorded_as_failed_and_fails_its_caller():
    link, held, observed = metered()
    trace = FakeTrace("t")
    failures: List[Any] = []
    run_within(trace, lambda: link.execute(b"GET", b"k").addErrback(failures.append))
    held.pending[0].errback(RedisUnavailable("down"))
    assert trace.calls == [("GET", "RedisUnavailable", {"db.system.name": "redis", "db.operation.batch.size": 1})]
    assert failures[0].check(RedisUnavailable) and observed[0][2] == "unavailable"


def test_cancelling_a_traced_call_cancels_the_call():
    link, held, _ = metered()
    call = run_within(FakeTrace("t"), link.execute, b"GET", b"k")
    call.addErrback(lambda failure: failure.trap(defer.CancelledError))
    call.cancel()
    assert held.pending[0].called


@pytest.mark.parametrize("acknowledged", [1, (True, 1)], ids=["script-and-wait", "outcomes"])
def test_a_script_is_named_and_a_wait_says_how_many_replicas_had_the_write(acknowledged):
    link, held, _ = metered()
    trace = FakeTrace("t")
    put = Script(b"local function put(keys, argv) return 1 end\nreturn put(KEYS, ARGV)\n")
    if isinstance(acknowledged, tuple):
        run_within(trace, link.pipeline_outcomes, [put.call([b"k"], [])], [put], (b"WAIT", 1, 100))
        held.pending[0].callback([(True, 1), acknowledged])
    else:
        run_within(trace, link.run_script_waiting, put, [b"k"], [], (b"WAIT", 1, 100))
        held.pending[0].callback((1, acknowledged))
    name, error, attributes = trace.calls[0]
    assert name == "EVALSHA put WAIT" and error is None
    assert attributes["jetway.wait.replicas"] == 1 and attributes["jetway.wait.acknowledged"] == 1


def test_the_active_trace_is_held_by_the_context_so_that_reading_it_never_raises():
    """The module sets its variable as it loads: the context it loaded in (the reactor's) and every copy of it
    hold it, so ``active()`` finds it instead of raising and catching a KeyError inside PyPy's ``_contextvars``,
    which makes the JIT build the frames it kept virtual (docs/tracing.md, "What it costs")."""
    import contextvars

    context = contextvars.copy_context()
    assert [var.name for var in context if var.name == "jetway_active_trace"] == ["jetway_active_trace"]
    assert context.run(active) is None
    assert context.run(run_within, FakeTrace("t"), active).name == "t"
    assert context.run(active) is None  # restored to None, still held (not deleted)
    assert any(var.name == "jetway_active_trace" for var in context)
