"""Idempotency-Key records: the first response to a request, kept so a retry gets it again.

IETF draft-ietf-httpapi-idempotency-key-header. A record is one Redis hash
per token and key (its own hash slot, so records spread over a cluster):

    jw:idem:{<sha256 of token digest and key>}   HASH, expires 24 h after the claim
        f  fingerprint of the request (method, target, media type, body)
        s  running | done
        o  the owner of the claim (a nonce of the attempt executing it)
        l  when the owner's lease ends (ms, Redis's clock)
        p  the plan: ids and ETags the attempt writes with, chosen once
        rs, rh, rb  the response once done: status, headers (JSON), body

The order of steps is what makes a retry safe even after a worker is killed
mid-request: (1) claim the key with a plan, atomically; (2) write with the
plan's ETags and ids (every write script is a no-op that reports success
when the document already carries the ETag it would write, so writing a
plan twice writes once); (3) record the response; (4) answer. A retry
that finds the record done gets the stored response; one that finds it
running gets 409 until the lease ends, and then takes the claim over and
carries out the same plan, which finds its writes done and answers as the
first attempt would have. A request refused before it wrote anything gives
its claim back, so a corrected retry is not stuck with the refusal.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache.documents.import_progress import ImportProgress
from cache.redis.link import Link
from cache.redis.script import Script

CLAIMED, TAKEN_OVER, DONE, MISMATCH, RUNNING = "claimed", "taken-over", "done", "mismatch", "running"
DEFAULT_TTL_SECONDS = 24 * 3600
PREFIX = b"jw:idem:"

# KEYS: record. ARGV: fingerprint, owner, lease ms, ttl s, plan.
# Returns {outcome, plan} for claimed/taken-over, {outcome, status, headers,
# body} for done, {outcome, lease ms left} for running, {outcome} for mismatch.
CLAIM = Script(
    b"""
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local state = redis.call('HGET', KEYS[1], 's')
if not state then
  redis.call('HSET', KEYS[1], 's', 'running', 'f', ARGV[1], 'o', ARGV[2], 'l', now_ms + tonumber(ARGV[3]), 'p', ARGV[5])
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  return {'claimed', ARGV[5]}
end
if redis.call('HGET', KEYS[1], 'f') ~= ARGV[1] then return {'mismatch'} end
if state == 'done' then return {'done', unpack(redis.call('HMGET', KEYS[1], 'rs', 'rh', 'rb'))} end
local lease = tonumber(redis.call('HGET', KEYS[1], 'l'))
if lease > now_ms then return {'running', string.format('%.0f', lease - now_ms)} end
redis.call('HSET', KEYS[1], 'o', ARGV[2], 'l', now_ms + tonumber(ARGV[3]))
return {'taken-over', redis.call('HGET', KEYS[1], 'p')}
"""
)

# KEYS: record. ARGV: status, headers, body. Returns 1 when recorded.
RECORD = Script(
    b"""
if not redis.call('HGET', KEYS[1], 's') then return 0 end
redis.call('HSET', KEYS[1], 's', 'done', 'rs', ARGV[1], 'rh', ARGV[2], 'rb', ARGV[3])
redis.call('HDEL', KEYS[1], 'o', 'l')
return 1
"""
)

# KEYS: record. ARGV: owner. Ends the lease of a claim still this owner's and
# running, keeping its plan: a retry takes it over at once and writes the same.
END_LEASE = Script(
    b"""
if redis.call('HGET', KEYS[1], 's') == 'running' and redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  return redis.call('HSET', KEYS[1], 'l', 0)
end
return 0
"""
)


@dataclass(frozen=True)
class StoredResponse:
    status: int
    headers: Tuple[Tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True)
class Claim:
    """What a claim found: ``outcome`` and, by outcome, the plan, the stored response or the lease left."""

    outcome: str
    owner: bytes = b""
    plan: bytes = b""
    response: Optional[StoredResponse] = None
    lease_left: float = 0.0

    @property
    def executes(self) -> bool:
        """This attempt carries the request out (first, or after a lease that ended)."""
        return self.outcome in (CLAIMED, TAKEN_OVER)


class IdempotencyRecords:
    """Claims, records and gives back Idempotency-Key records on a ``Link``."""

    def __init__(self, link: Link, lease_seconds: float, ttl_seconds: int = DEFAULT_TTL_SECONDS) -> None:
        self._link = link
        self.imports = ImportProgress(link, ttl_seconds)
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._ttl = ttl_seconds

    def claim(self, token_digest: bytes, key: str, fingerprint: bytes, plan: bytes) -> defer.Deferred:
        """Fires with a ``Claim``: this attempt's, or what an earlier one left."""
        owner = os.urandom(8).hex().encode()
        call = CLAIM.call([record_key(token_digest, key)], [fingerprint, owner, self._lease_ms, self._ttl, plan])
        return self._link.pipeline_scripts([call], [CLAIM]).addCallback(lambda replies: _claim(replies[0], owner))

    def record(self, token_digest: bytes, key: str, response: StoredResponse) -> defer.Deferred:
        headers = json.dumps(list(response.headers)).encode()
        call = RECORD.call([record_key(token_digest, key)], [response.status, headers, response.body])
        return self._link.pipeline_scripts([call], [RECORD])

    def end_lease(self, token_digest: bytes, key: str, owner: bytes) -> defer.Deferred:
        """After a failure that is not recorded: the next retry carries out the same plan without waiting."""
        call = END_LEASE.call([record_key(token_digest, key)], [owner])
        return self._link.pipeline_scripts([call], [END_LEASE])


def record_key(token_digest: bytes, key: str) -> bytes:
    """The record of ``key`` for one token (a hash of both: keys are the client's text)."""
    digest = hashlib.sha256(token_digest + b"\0" + key.encode()).hexdigest()[:32]
    return PREFIX + b"{" + digest.encode() + b"}"


def fingerprint(method: str, target: str, content_type: Optional[str], body: bytes) -> bytes:
    """What makes two requests the same request (the draft leaves it to the server)."""
    parts = (method.encode(), target.encode(), (content_type or "").encode(), body)
    return hashlib.sha256(b"\0".join(parts)).hexdigest().encode()


def _claim(reply: Sequence[Any], owner: bytes) -> Claim:
    outcome = reply[0].decode()
    if outcome in (CLAIMED, TAKEN_OVER):
        return Claim(outcome, owner, plan=reply[1])
    if outcome == DONE:
        status, headers, body = reply[1], reply[2], reply[3]
        pairs: List[Tuple[str, str]] = [(name, value) for name, value in json.loads(headers)]
        return Claim(outcome, response=StoredResponse(int(status), tuple(pairs), body))
    if outcome == RUNNING:
        return Claim(outcome, lease_left=int(reply[1]) / 1000)
    return Claim(outcome)
