"""A link wrapper that times every Redis call, reports its failures, and records it in the request's trace.

It knows nothing of the metrics or the tracing library: it hands
``(operation, seconds, error kind or None)`` to a callback, so any link (one
Redis, Sentinel, Cluster) is measured the same way; and when a request's
trace is active (``cache.trace_scope``) it hands that trace the call's name,
times and outcome (on a cluster, the nodes the call went to), and fires the
caller's continuation with the trace active again (``cache.trace_scope``'s
docstring says why). With tracing off the cost is one context-variable read
per call.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Sequence

from twisted.internet import defer
from twisted.python.failure import Failure

from cache.redis.errors import RedisReplyError, RedisTimeout, RedisUnavailable
from cache.redis.script import Script
from cache.redis.slots import command_key
from cache.trace_scope import Traced, active, run_within

Observe = Callable[[str, float, Optional[str]], None]
_KINDS = ((RedisUnavailable, "unavailable"), (RedisTimeout, "timeout"), (RedisReplyError, "error_reply"))
# Command names a span's name lists, at most; the count is an attribute.
_NAMES_SHOWN = 4
# A script's call as a span names it (its keys and arguments are not recorded).
_A_SCRIPT = ((b"EVALSHA",),)


class MeteredLink:
    """Delegates to ``link``; every call's latency and outcome go to ``observe`` (and to the active trace)."""

    def __init__(self, link: Any, observe: Observe, clock: Callable[[], float] = time.perf_counter) -> None:
        self._link = link
        self._observe = observe
        self._clock = clock

    def close(self) -> defer.Deferred:
        return self._link.close()

    def execute(self, *command: Any) -> defer.Deferred:
        return self._timed("execute", self._link.execute(*command), active(), (command,))

    def pipeline(self, commands: Any) -> defer.Deferred:
        return self._timed("pipeline", self._link.pipeline(commands), active(), commands)

    def pipeline_scripts(self, commands: Any, scripts: Any) -> defer.Deferred:
        return self._timed("pipeline", self._link.pipeline_scripts(commands, scripts), active(), commands, scripts)

    def run_script(self, script: Any, keys: Any, args: Any) -> defer.Deferred:
        pending = self._link.run_script(script, keys, args)
        return self._timed("script", pending, active(), _A_SCRIPT, (script,), routed_by=keys[:1])

    def run_script_waiting(self, script: Any, keys: Any, args: Any, wait: Any) -> defer.Deferred:
        pending = self._link.run_script_waiting(script, keys, args, wait)
        return self._timed("script", pending, active(), (_A_SCRIPT[0], wait), (script,), wait, keys[:1])

    def pipeline_outcomes(self, commands: Any, scripts: Any, wait: Any = None) -> defer.Deferred:
        pending = self._link.pipeline_outcomes(commands, scripts, wait)
        sent = commands if wait is None else [*commands, wait]
        return self._timed("pipeline", pending, active(), sent, scripts, wait)

    def _timed(
        self,
        operation: str,
        pending: defer.Deferred,
        trace: Optional[Traced],
        commands: Sequence[Any],
        scripts: Sequence[Script] = (),
        wait: Any = None,
        routed_by: Optional[Sequence[bytes]] = None,
    ) -> defer.Deferred:
        """``routed_by``: the keys that route the call on a cluster (None: each command's own)."""
        if trace is not None:
            return self._traced(operation, pending, trace, commands, scripts, wait, routed_by)
        # A bound method and its arguments, not a closure made per call.
        return pending.addBoth(self._done, operation, self._clock())

    def _done(self, result: Any, operation: str, started: float) -> Any:
        self._observe(operation, self._clock() - started, _kind(result))
        return result

    def _traced(
        self,
        operation: str,
        pending: defer.Deferred,
        trace: Traced,
        commands: Sequence[Any],
        scripts: Sequence[Script],
        wait: Any,
        routed_by: Optional[Sequence[bytes]],
    ) -> defer.Deferred:
        """The call's span recorded once it is answered, and its caller resumed with ``trace`` active.

        The caller's callbacks go on a Deferred of their own, fired with the
        trace active: on ``pending`` they would run in the context of the
        Redis connection that fired it. Cancelling it cancels the call.
        """
        relay = defer.Deferred(lambda _: pending.cancel())
        started, started_ns = self._clock(), time.time_ns()
        nodes = self._nodes(commands, routed_by)

        def answered(result: Any) -> None:
            error = _error(result)
            self._observe(operation, self._clock() - started, _kind(result))
            attributes = _attributes(commands, scripts, wait, result)
            if nodes:
                attributes.update(nodes)
            trace.redis_call(_span_name(commands, scripts, wait), started_ns, time.time_ns(), error, attributes)
            if not relay.called:
                run_within(trace, relay.callback, result)

        pending.addBoth(answered)
        return relay

    def _nodes(self, commands: Sequence[Any], routed_by: Optional[Sequence[bytes]]) -> Dict[str, Any]:
        """On a cluster, the span's nodes: the masters the slot map named when the call was sent (a command a
        MOVED or ASK sent on elsewhere is not followed); nothing on one Redis or a Sentinel group."""
        nodes_of = getattr(self._link, "nodes_of", None)
        if nodes_of is None:
            return {}
        nodes = nodes_of([command_key(command) for command in commands] if routed_by is None else routed_by)
        if len(nodes) == 1:
            return {"server.address": nodes[0][0], "server.port": nodes[0][1]}
        return {"jetway.redis.nodes": [f"{host}:{port}" for host, port in nodes]} if nodes else {}


def _error(result: Any) -> Optional[BaseException]:
    if isinstance(result, Failure):
        return result.value  # type: ignore[no-any-return]
    return result if isinstance(result, Exception) else None


def _kind(result: Any) -> Optional[str]:
    if isinstance(result, Exception) or hasattr(result, "value"):
        error = getattr(result, "value", result)
        return next((name for error_type, name in _KINDS if isinstance(error, error_type)), "other")
    return None


def _command_name(command: Sequence[Any], scripts: Sequence[Script]) -> str:
    """A command's name (``HMGET``), or a script call's ``EVALSHA`` and the script's name."""
    name = command[0]
    text = name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
    text = text.upper()
    if text != "EVALSHA" or not scripts:
        return text
    if len(command) == 1:
        return f"EVALSHA {scripts[0].name}"  # run_script's: its one script
    return next((f"EVALSHA {script.name}" for script in scripts if script.sha == command[1]), text)


def _span_name(commands: Sequence[Any], scripts: Sequence[Script], wait: Any) -> str:
    """``HMGET``, ``EVALSHA put WAIT``: the commands of one round trip, in order, the first few."""
    names = [_command_name(command, scripts) for command in commands[:_NAMES_SHOWN]]
    if len(commands) > _NAMES_SHOWN:
        names.append("…")
    return " ".join(names)


def _attributes(commands: Sequence[Any], scripts: Sequence[Script], wait: Any, result: Any) -> Dict[str, Any]:
    attributes: Dict[str, Any] = {"db.system.name": "redis", "db.operation.batch.size": len(commands)}
    if wait is not None:
        # The write concern's WAIT (cache.documents.write_concern): replicas asked for, and how many had it.
        attributes["jetway.wait.replicas"] = int(wait[1])
        acknowledged = result[-1] if isinstance(result, (list, tuple)) and result else None
        if isinstance(acknowledged, tuple) and len(acknowledged) == 2:  # an outcome: (ok, value)
            acknowledged = acknowledged[1]
        if isinstance(acknowledged, (int, bytes)) and not isinstance(acknowledged, bool):
            attributes["jetway.wait.acknowledged"] = int(acknowledged)
    return attributes
