"""``python -m api check``: is this instance configured and can it reach Redis?

For user data and health scripts: prints what it found, exits 0 when the
configuration is valid and Redis answers a PING in time, 1 otherwise (a bad
setting is caught earlier, by the CLI, with exit code 2).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from api.config import Settings
from api.oneshot import run_with_link
from cache.redis.link import Link


def run(settings: Settings) -> int:
    @defer.inlineCallbacks
    def ping(link: Link) -> Any:
        reply = yield link.execute(b"PING")
        answer = reply.decode() if isinstance(reply, bytes) else reply  # a status reply comes as str
        print(f"jetway: configuration valid; Redis at {settings.redis.describe()} answered {answer}")
        return 0

    return run_with_link(settings, ping)
