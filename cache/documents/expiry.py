"""Documents that expire by TTL leave their indexes and are told to the feed, by a paced sweeper under a lease.

Consistency rule: a document whose TTL ends at T (Redis's clock) is never read
after T (Redis's own expiry); its entries, its id in the shard's id index and
its ``expire`` event follow within ``TICK`` plus a few steps while a sweeper
holds its collection's lease and the due expiries stay under the sweep's rate
(docs/design/expiry.md, "The bound"). The work is all in Redis
(``cache.indexes.expiry_scripts``: each expiring document's id in ``xe`` with
its expiry, its entries in ``xm``), so a sweeper that dies loses nothing: the
lease runs out (``LEASE_MS``) and the next tick of any worker takes it.

``ExpiringCollections`` is the registry the sweepers visit (``keys.EXPIRING``):
a worker adds a collection to it as it sends its first write with a TTL, and
adds it again whenever a tick finds it missing while it holds expiring
documents (a flush, a write lost in a failover), so none stays out of it for
longer than a tick. The collection's sweeper takes it out once it held no
expiring document for ``IDLE_SECONDS`` (a worker that writes it with a TTL
again adds it back at its next tick).

``ExpirySweeper``: every worker, every ``TICK``, reads the registry and, for
each collection whose lease it holds or takes (held on while the worker lives,
so the same worker sweeps on), reads each shard's next due time and runs
``EXPIRE_DUE`` steps of up to ``STEP`` ids on the due shards (one step of each
in one pipeline of ``ROUND`` ids at most), pausing ``PAUSE`` times as long as
each round took (half of Redis at most while behind).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Set

from twisted.internet import defer, reactor, task
from twisted.logger import Logger

from cache import keys
from cache.documents.scripts import EXPIRE_DUE
from cache.feed.streams import FeedLog
from cache.redis.link import Link
from cache.redis.script import Script

TICK = 0.25  # seconds between looks at the due expiries: most of the bound
STEP = 32  # ids per EXPIRE_DUE step: short for Redis, as a build's (docs/design/expiry.md, "Costs measured")
# Ids per pipeline of steps (one per due shard): Redis runs a client's pipeline back to back, so this bounds how long
# a sweep holds other commands, as STEP does one step's.
ROUND = 256
PAUSE = 1.0  # after a step that left more due, wait as long as it took: half of Redis at most
LEASE_MS = 3000  # a sweeper that died is taken over this long after its last tick
# A shard is looked at once its next expiry is this close by the worker's clock: EXPIRE_DUE judges by Redis's own
# (TIME), so a worker's clock running behind Redis's by up to this much delays nothing.
SKEW_MS = 1000
IDLE_SECONDS = 600  # a collection with no expiring document this long leaves the registry
SWEEP_NAME = b"~expiry"  # the lease's name where a build's is its index's (keys.index_build_lease_key)
_MEMO = 4096  # collections a worker remembers having registered; past it, it forgets (and registers again)
_SHARDS = keys.INDEX_SHARDS
_HEAL = 64  # collections a tick looks at again at most (16 EXISTS each): after a flush, the rest at the next ticks
_log = Logger()

# KEYS: a sweep's lease. ARGV: the holder, ms. 1 when the holder holds it now (renewed, or taken), else 0.
_LEASE = Script(
    b"""
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)


class ExpiringCollections:
    """The registry of collections with documents that may expire: added to as a write with a TTL is sent."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._known: Set[bytes] = set()  # registered by this worker, as far as it knows
        self._forgetting: Set[bytes] = set()  # missing from the registry with nothing due at the last look

    def note(self, collection: bytes) -> None:
        """``collection`` gets a write with a TTL: registered once per worker (the sweeper's ``heal`` keeps it)."""
        if collection in self._known and collection not in self._forgetting:
            return
        if len(self._known) >= _MEMO:
            self._known.clear()
        self._known.add(collection)
        self._forgetting.discard(collection)
        self._link.execute(b"SADD", keys.EXPIRING, collection).addErrback(self._unsent, collection)

    def _unsent(self, failure: Any, collection: bytes) -> None:
        self._known.discard(collection)  # the next write with a TTL sends it again
        _log.warn(
            "{collection} not registered for expiry: {error}",
            collection=collection.decode(),
            error=failure.getErrorMessage(),
        )

    @defer.inlineCallbacks
    def heal(self, registered: Iterable[bytes]) -> Any:
        """Registers again the collections this worker wrote with a TTL that the registry lacks (a flush, a write
        lost in a failover) and that still hold expiring documents; fires with them.

        One that holds none is forgotten at the second look that finds it so, not the first: a write with a TTL
        sent before the first look may reach Redis after it (a write sent between the looks registers it again).
        """
        missing = sorted(self._known.difference(registered))[:_HEAL]
        if not missing:
            return []
        found = yield self._link.pipeline(
            [(b"EXISTS", keys.expiry_key(collection, shard)) for collection in missing for shard in range(_SHARDS)]
        )
        again = []
        for at, collection in enumerate(missing):
            if any(found[at * _SHARDS : (at + 1) * _SHARDS]):
                again.append(collection)
                self._forgetting.discard(collection)
            elif collection in self._forgetting:
                self._known.discard(collection)
                self._forgetting.discard(collection)
            else:
                self._forgetting.add(collection)
        if again:
            yield self._link.execute(b"SADD", keys.EXPIRING, *again)
        return again


class ExpirySweeper:
    """Carries out the due expiries of every registered collection whose lease this worker holds."""

    def __init__(self, link: Link, expiring: ExpiringCollections, feed: FeedLog, clock: Any = None) -> None:
        self._link = link
        self._expiring = expiring
        self._feed = feed
        self._clock = reactor if clock is None else clock
        self._holder = b"%d:%d" % (os.getpid(), id(self))
        self._loop: Any = None
        self._busy = False
        self._failing: Optional[str] = None  # the error of the ticks failing since the last that went through
        self._idle_since: Dict[bytes, float] = {}  # collections with no expiring document, since when
        self.expired = 0  # expiries this worker carried out (a metric)
        self.lag_seconds = 0.0  # at the last tick: how long the oldest due expiry seen had been due (a metric)

    def start(self) -> None:
        """Look every ``TICK`` from now on."""
        self._loop = task.LoopingCall(self.tick)
        self._loop.clock = self._clock
        self._loop.start(TICK, now=False)

    def stop(self) -> None:
        """No more looks (the lease runs out on its own: another worker takes it)."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def tick(self) -> defer.Deferred:
        """One look at every registered collection; a tick while the last one is under way is skipped."""
        if self._busy:
            return defer.succeed(None)
        self._busy = True
        looking = self._sweep()
        looking.addCallbacks(self._recovered, self._failed)
        looking.addBoth(self._looked)
        return looking

    def _failed(self, failure: Any) -> None:
        # Once per outage: every tick fails alike while Redis is away, and its own warnings say so already.
        error = failure.getErrorMessage()
        if self._failing is None:
            _log.warn("expiry sweep: {error}; trying again every {tick} s", error=error, tick=TICK)
        self._failing = error

    def _recovered(self, _: Any) -> None:
        if self._failing is not None:
            _log.info("expiry sweep: going on (it had failed: {error})", error=self._failing)
        self._failing = None

    def _looked(self, _: Any) -> None:
        self._busy = False

    @defer.inlineCallbacks
    def _sweep(self) -> Any:
        registered = yield self._link.execute(b"SMEMBERS", keys.EXPIRING)
        healed = yield self._expiring.heal(registered)
        lag = 0.0
        for collection in sorted({*registered, *healed}):
            lag = max(lag, (yield self._collection(collection)))
        self.lag_seconds = lag

    @defer.inlineCallbacks
    def _collection(self, collection: bytes) -> Any:
        """The collection's due shards swept, if this worker holds its lease; how long its oldest had been due."""
        lease = keys.index_build_lease_key(collection, SWEEP_NAME, b"")
        held = yield self._link.run_script(_LEASE, [lease], [self._holder, LEASE_MS])
        if not held:
            return 0.0
        firsts = yield self._link.pipeline(
            [(b"ZRANGE", keys.expiry_key(collection, shard), 0, 0, b"WITHSCORES") for shard in range(keys.INDEX_SHARDS)]
        )
        now_ms = self._clock.seconds() * 1000
        if not any(firsts):
            yield self._forget_if_idle(collection, now_ms / 1000)
            return 0.0
        self._idle_since.pop(collection, None)
        due = [
            (shard, float(first[1]))
            for shard, first in enumerate(firsts)
            if first and float(first[1]) <= now_ms + SKEW_MS
        ]
        lag = max([(now_ms - at) / 1000 for _, at in due] + [0.0])
        if due:
            yield self._steps(collection, [shard for shard, _ in due], lease)
        return lag

    def _forget_if_idle(self, collection: bytes, now: float) -> defer.Deferred:
        """Out of the registry once it held no expiring document for ``IDLE_SECONDS``: no more looks at it."""
        since = self._idle_since.setdefault(collection, now)
        if now - since < IDLE_SECONDS:
            return defer.succeed(None)
        del self._idle_since[collection]
        return self._link.execute(b"SREM", keys.EXPIRING, collection)

    @defer.inlineCallbacks
    def _steps(self, collection: bytes, shards: List[int], lease: bytes) -> Any:
        """``EXPIRE_DUE`` steps on ``shards`` until none is due, paced, while this worker holds ``lease``.

        One step per due shard in one pipeline (on a cluster, each node runs its own at once): a round trip per
        step and shard left Redis idle between steps, the sweep's rate set by the round trip rather than by Redis.
        """
        parts = {shard: self._feed.script_parts(b"expire", collection, shard) for shard in shards}
        while True:
            started = self._clock.seconds()
            step = max(1, min(STEP, ROUND // len(shards)))
            calls = [
                EXPIRE_DUE.call([keys.index_key(collection, shard), *parts[shard][0]], [step, *parts[shard][1]])
                for shard in shards
            ]
            replies = yield self._link.pipeline_scripts(calls, [EXPIRE_DUE])
            self.expired += sum(reply[0] for reply in replies)
            shards = [shard for shard, reply in zip(shards, replies) if reply[1] >= step]
            if not shards:
                return
            held = yield self._link.run_script(_LEASE, [lease], [self._holder, LEASE_MS])
            if not held:
                return  # the lease ran out and another worker took the sweep over
            yield task.deferLater(self._clock, (self._clock.seconds() - started) * PAUSE, lambda: None)
