"""Run one job against Redis from the command line, then stop the reactor."""

from __future__ import annotations

import sys
from typing import Any, Callable, List

from twisted.internet import defer

from api.config import Settings
from cache.errors import StoreError
from cache.redis.link import Link
from cache.redis.topology import connect


def run_with_link(settings: Settings, job: Callable[[Link], defer.Deferred]) -> int:
    """Run ``job(link)``; its result is the exit code (1 when Redis fails it)."""
    from twisted.internet import reactor

    outcome: List[int] = []

    @defer.inlineCallbacks
    def run() -> Any:
        link = connect(settings.redis, reactor, settings.redis_timeout, poolsize=1)
        try:
            code = yield job(link)
            outcome.append(code)
        except StoreError as error:
            print(
                f"jetway: Redis at {settings.redis.describe()} failed: {error or type(error).__name__}", file=sys.stderr
            )
            outcome.append(1)
        finally:
            yield link.close()
            reactor.stop()

    reactor.callWhenRunning(run)
    reactor.run(installSignalHandlers=False)
    return outcome[0] if outcome else 1
