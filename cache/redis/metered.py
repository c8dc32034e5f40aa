"""A link wrapper that times every Redis call and reports its failures.

It knows nothing of the metrics library: it hands ``(operation, seconds,
error kind or None)`` to a callback, so any link (one Redis, Sentinel,
Cluster) is measured the same way.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from twisted.internet import defer

from cache.redis.errors import RedisReplyError, RedisTimeout, RedisUnavailable

Observe = Callable[[str, float, Optional[str]], None]
_KINDS = ((RedisUnavailable, "unavailable"), (RedisTimeout, "timeout"), (RedisReplyError, "error_reply"))


class MeteredLink:
    """Delegates to ``link``; every call's latency and outcome go to ``observe``."""

    def __init__(self, link: Any, observe: Observe, clock: Callable[[], float] = time.perf_counter) -> None:
        self._link = link
        self._observe = observe
        self._clock = clock

    def close(self) -> defer.Deferred:
        return self._link.close()

    def execute(self, *command: Any) -> defer.Deferred:
        return self._timed("execute", self._link.execute(*command))

    def pipeline(self, commands: Any) -> defer.Deferred:
        return self._timed("pipeline", self._link.pipeline(commands))

    def pipeline_scripts(self, commands: Any, scripts: Any) -> defer.Deferred:
        return self._timed("pipeline", self._link.pipeline_scripts(commands, scripts))

    def run_script(self, script: Any, keys: Any, args: Any) -> defer.Deferred:
        return self._timed("script", self._link.run_script(script, keys, args))

    def run_script_waiting(self, script: Any, keys: Any, args: Any, wait: Any) -> defer.Deferred:
        return self._timed("script", self._link.run_script_waiting(script, keys, args, wait))

    def pipeline_outcomes(self, commands: Any, scripts: Any, wait: Any = None) -> defer.Deferred:
        return self._timed("pipeline", self._link.pipeline_outcomes(commands, scripts, wait))

    def _timed(self, operation: str, pending: defer.Deferred) -> defer.Deferred:
        # A bound method and its arguments, not a closure made per call.
        return pending.addBoth(self._done, operation, self._clock())

    def _done(self, result: Any, operation: str, started: float) -> Any:
        kind = None
        if isinstance(result, Exception) or hasattr(result, "value"):
            error = getattr(result, "value", result)
            kind = next((name for error_type, name in _KINDS if isinstance(error, error_type)), "other")
        self._observe(operation, self._clock() - started, kind)
        return result
