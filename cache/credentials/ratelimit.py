"""Per-token rate limits shared by every worker and instance: GCRA in Redis.

The generic cell rate algorithm keeps one number per token, the theoretical
arrival time (TAT) of the next request, in ``jw:rl:{<digest>}``. A limit of
N per period allows a burst of N and then one request every period/N. The
script reads Redis' own clock, so workers with skewed clocks agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, Tuple, Union

from cache.redis.script import Script

# KEYS: the token's limit key. ARGV: emission interval (µs), period (µs), and
# the cost in requests (1 when absent; a batch costs one per operation).
# Returns {allowed (0/1), remaining, retry after (µs), reset (µs)}.
GCRA = Script(
    b"""
local interval = tonumber(ARGV[1])
local cost = tonumber(ARGV[3]) or 1
local period = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - period
if now < allow_at then
  return {0, 0, allow_at - now, tat - now}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((now + period - new_tat) / interval), 0, new_tat - now}
"""
)


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    retry_after: int  # whole seconds
    reset: int  # whole seconds until the full burst is available again

    def headers(self) -> Sequence[Tuple[str, str]]:
        return (
            ("RateLimit-Limit", str(self.limit)),
            ("RateLimit-Remaining", str(self.remaining)),
            ("RateLimit-Reset", str(self.reset)),
        )


def limit_key(digest: bytes) -> bytes:
    return b"jw:rl:{" + digest + b"}"


def gcra_command(digest: bytes, requests: int, period: int, cost: int = 1) -> Tuple[Union[bytes, int], ...]:
    """The command that takes ``cost`` requests from the token's allowance."""
    period_us = period * 1_000_000
    arguments = [period_us // requests, period_us] if cost == 1 else [period_us // requests, period_us, cost]
    return GCRA.call([limit_key(digest)], arguments)


def decision(reply: Any, requests: int) -> RateDecision:
    allowed, remaining, retry_after_us, reset_us = (int(value) for value in reply)
    return RateDecision(
        allowed=bool(allowed),
        limit=requests,
        remaining=max(0, remaining),
        retry_after=math.ceil(retry_after_us / 1_000_000),
        reset=math.ceil(reset_us / 1_000_000),
    )
