"""An NDJSON import's progress under an ``Idempotency-Key``: its lease, its last line written, its plan's seed.

Three keys per token, collection and key, in one hash slot (a cluster runs
each script below on one node), for 24 hours:

    jw:import:{<sha256 of token digest, collection and key>}         the last line whose group was written
    jw:import:{...}:busy    the lease: the owner (a nonce of the running import), expiring unless renewed
    jw:import:{...}:since   when the import first ran (ms, Redis's clock): the time part of its new ids

The lease is what keeps two imports under one key from writing at once (a
retry sent while the cut-short upload still writes would otherwise write
its last group twice). Its holder renews it while it lives, whatever it is
doing (``Lease``, a timer, not each group), and sends a group only while
its last renewal was confirmed less than ``LEASE_SECONDS - MARGIN_SECONDS``
ago; every change is a compare on the owner, so an import that lost its
lease neither records progress nor frees the lease of the one that took it.

What makes a resume exact even when the recorded line lags what was
written (a worker killed, or Redis failing, between a group's writes and
its record) is the plan: the ETag of line N's write, and a new document's
id, are made from the key and N (``planned_etag``, ``planned_id``), and a
write script that finds the document already carrying that ETag applies
nothing and logs no event (``cache.documents.scripts``, result 3). So a line written
before and sent again is found written, not written twice.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Optional

from twisted.internet import defer, task

from cache.documents.ids import encode_ulid
from cache.redis.link import Link
from cache.redis.script import Script

PREFIX = b"jw:import:"
TTL_SECONDS = 24 * 3600
# How long an import holds its key past its last renewal, how often it renews, and the margin within
# which it stops sending groups: a renewal must fail for LEASE - MARGIN seconds before another can claim.
LEASE_SECONDS = 15
RENEW_SECONDS = 3
MARGIN_SECONDS = 5

# KEYS: progress, lease, since. ARGV: owner, lease ms, ttl s.
# Returns {1, last line, since ms} when claimed, {0, ms left of the other's lease} when held.
CLAIM = Script(
    b"""
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[2])}
end
local since = redis.call('GET', KEYS[3])
if not since then
  local now = redis.call('TIME')
  since = string.format('%.0f', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
end
redis.call('SET', KEYS[3], since, 'EX', ARGV[3])
return {1, redis.call('GET', KEYS[1]) or '0', since}
"""
)

# KEYS: lease. ARGV: owner, lease ms. Returns 1 when still this owner's (and renewed), else 0.
RENEW = Script(
    b"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""
)

# KEYS: progress, lease. ARGV: owner, lease ms, ttl s, line. Returns 1 when recorded (this owner's lease).
RECORD = Script(
    b"""
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[4], 'EX', ARGV[3])
return 1
"""
)

# KEYS: lease. ARGV: owner. Frees the lease only if it is still this owner's.
RELEASE = Script(
    b"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""
)


class LeaseLost(Exception):
    """The import's lease is no longer known to be its own: it must not write another group."""


@dataclass(frozen=True)
class Claimed:
    """A claim's outcome: the lease (None: another import holds the key, for ``busy_for`` seconds more)."""

    lease: Optional[Lease]
    last_line: int = 0
    since_ms: int = 0
    busy_for: float = 0.0


class ImportProgress:
    """Claims, records and releases imports' keys on a ``Link``."""

    def __init__(self, link: Link, ttl_seconds: int = TTL_SECONDS) -> None:
        self._link = link
        self._ttl = ttl_seconds

    def claim(self, token_digest: bytes, collection: bytes, key: str, clock: Any) -> defer.Deferred:
        """Fires with ``Claimed``: the lease, renewed from now until ``Lease.release``, or who holds the key."""
        base = import_key(token_digest, collection, key)
        owner = os.urandom(8).hex().encode()
        call = CLAIM.call([base, base + b":busy", base + b":since"], [owner, LEASE_SECONDS * 1000, self._ttl])

        def claimed(replies: Any) -> Claimed:
            reply = replies[0]
            if not reply[0]:
                return Claimed(None, busy_for=max(0, int(reply[1])) / 1000)
            lease = Lease(self._link, base, owner, self._ttl, clock)
            return Claimed(lease, int(reply[1]), int(reply[2]))

        return self._link.pipeline_scripts([call], [CLAIM]).addCallback(claimed)


class Lease:
    """One import's hold on its key: renewed by a timer while it lives, checked before each group."""

    def __init__(self, link: Link, base: bytes, owner: bytes, ttl: int, clock: Any) -> None:
        self._link = link
        self._base = base
        self._owner = owner
        self._ttl = ttl
        self._clock = clock
        self._held_until = clock.seconds() + LEASE_SECONDS - MARGIN_SECONDS
        self._renewing = task.LoopingCall(self._renew)
        self._renewing.clock = clock
        self._renewing.start(RENEW_SECONDS, now=False)

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the lease is known held for at least ``MARGIN_SECONDS`` more."""
        if self._clock.seconds() >= self._held_until:
            raise LeaseLost()

    def record(self, line: int) -> defer.Deferred:
        """The last line written (its group whole), recorded while the lease is this import's; else ``LeaseLost``."""
        keys = [self._base, self._base + b":busy"]
        call = RECORD.call(keys, [self._owner, LEASE_SECONDS * 1000, self._ttl, line])
        return self._link.pipeline_scripts([call], [RECORD]).addCallback(self._confirmed, self._clock.seconds())

    def release(self) -> defer.Deferred:
        """Stop renewing, and free the key if it is still this import's (a compare-and-delete)."""
        if self._renewing.running:
            self._renewing.stop()
        self._held_until = 0.0
        call = RELEASE.call([self._base + b":busy"], [self._owner])
        return self._link.pipeline_scripts([call], [RELEASE])

    def _renew(self) -> defer.Deferred:
        asked = self._clock.seconds()
        call = RENEW.call([self._base + b":busy"], [self._owner, LEASE_SECONDS * 1000])
        renewing = self._link.pipeline_scripts([call], [RENEW]).addCallback(self._confirmed, asked)
        # A renewal that fails (Redis away) leaves the lease to run out: ``check`` stops the import in time.
        return renewing.addErrback(lambda _: None)

    def _confirmed(self, replies: Any, asked: float) -> None:
        if replies[0] == 1:
            # Counted from when it was asked: the lease ran from at latest then.
            self._held_until = max(self._held_until, asked + LEASE_SECONDS - MARGIN_SECONDS)
            return
        self._held_until = 0.0
        if self._renewing.running:
            self._renewing.stop()
        raise LeaseLost()


def import_key(token_digest: bytes, collection: bytes, key: str) -> bytes:
    digest = hashlib.sha256(token_digest + b"\0" + collection + b"\0" + key.encode()).hexdigest()[:32]
    return PREFIX + b"{" + digest.encode() + b"}"


@dataclass(frozen=True)
class Plan:
    """The ETag and new id each line of an import under a key is written with: the same on every attempt."""

    seed: bytes  # 16 hex digits of the key's digest
    since_ms: int

    @classmethod
    def of(cls, token_digest: bytes, collection: bytes, key: str, since_ms: int) -> Plan:
        # The first start is in the seed: a key used again once its records expired (24 h) plans anew, so its
        # lines are never taken for the earlier import's, written before.
        seed = b"plan\0%s\0%d" % (import_key(token_digest, collection, key), since_ms)
        return cls(hashlib.sha256(seed).hexdigest()[:16].encode(), since_ms)

    def etag(self, line: int) -> bytes:
        # Never reused: no other import has this seed, and no write made by a worker has this form.
        return b'"i%s-%x"' % (self.seed, line)

    def new_id(self, line: int) -> bytes:
        """A ULID: the import's first start as its time, then the seed's 40 bits and the line's (ids sort by line)."""
        return encode_ulid((self.since_ms << 80) | (int(self.seed[:10], 16) << 40) | (line & ((1 << 40) - 1))).encode()
