"""Declared indexes reach the shards, and are built over the documents already there, in steps.

``apply_specs`` gives every index shard of a collection the spec of its
declared indexes, ordered by the settings' generation (a later settings
change is never undone by an earlier one's spec arriving late). From the
moment a shard holds an index's spec, each write's script keeps the index
for the document it writes (``cache.indexes.scripts``).

``IndexBuilds`` indexes the documents written before, shard by shard, in
``BUILD`` steps of ``STEP`` documents (each one script call of a ms or
two), one step in flight per index, and a pause after each (``PAUSE``)
so that reads and writes keep most of Redis and of the worker. The
position is kept in the shard's spec, so a build is resumed by whoever
calls ``ensure`` next: the worker that stored the settings, or any
worker whose query met the index unbuilt (a restart, a failover, a worker
that died mid-build). One worker of the deployment builds an index at a
time: it holds a lease (``LEASE_SECONDS``, renewed at each step), so a
second worker whose query meets the index unbuilt leaves it to the first,
and takes over only once a lease ran out with its holder (dead, or cut off
from Redis). Were two to build at once it would still be right, only
dearer: a step sets each document's entry from its stored bytes, in the
same script as it reads them, and they would share the position.

A dropped index's entries go with its spec (``SPEC``); its field in each
document's hash is swept after, in ``SWEEP`` steps of ``SWEEP_STEP``
documents paced and leased the same way (one sweep per collection), from
the shards' lists of dropped fields. ``resume`` goes on with both, and
every worker calls it when a collection's settings change
(``cache.indexes.upkeep``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Sequence, Set, Tuple

from twisted.internet import defer, reactor, task
from twisted.logger import Logger

from cache import keys
from cache.indexes.declared import Index, spec_json
from cache.indexes.scripts import BUILD, SPEC, SWEEP
from cache.redis.link import Link
from cache.redis.script import Script

# Documents per build step, and its bytes for large ones (Redis decodes each): a step holds every other
# command for as long as it runs, so steps are small.
STEP = 128
STEP_BYTES = 256 * 1024
# After each step the build waits this many times as long as the step took: its share of Redis, and of the
# worker. Unpaced, or paced less, a build of 1,000,000 documents was faster but left PUTs below the target
# of 0.8 their rate meanwhile (loadtest/studies/_queries.py; each step size and pause tried:
# docs/history/performance.md, "Queries over declared indexes").
PAUSE = 3.0
# Documents per sweep step: each only loses a field (one HDEL), so a step this long is still short for Redis.
SWEEP_STEP = 512
# The sweep's name where a build's is the index's: its lease, and what this worker runs.
SWEEP_NAME = "~dropped"
_SHARDS = keys.INDEX_SHARDS
# How long a build's lease outlives its last step: a holder that died is taken over after this.
LEASE_SECONDS = 15
_log = Logger()

# KEYS: a build's lease. ARGV: its holder, seconds. Renews it if the holder still holds it (1), else 0.
_RENEW = Script(
    b"if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('EXPIRE', KEYS[1], ARGV[2]) return 1"
)
# KEYS: a build's lease. ARGV: its holder. Gives it up, if the holder still holds it.
_RELEASE = Script(b"if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0")


def apply_specs(link: Link, collection: bytes, generation: int, indexes: Sequence[Index]) -> defer.Deferred:
    """Every shard of ``collection`` gets the spec of ``indexes`` (of settings ``generation``); fails on an error."""
    spec = spec_json(tuple(indexes))
    commands = [
        SPEC.call([keys.index_spec_key(collection, shard)], [generation, spec]) for shard in range(keys.INDEX_SHARDS)
    ]
    return link.pipeline_outcomes(commands, [SPEC]).addCallback(_all_ok)


def _all_ok(outcomes: Any) -> None:
    for ok, reply in outcomes:
        if not ok:
            raise reply


class IndexBuilds:
    """The builds this worker runs: at most one per index version."""

    def __init__(self, link: Link, clock: Any = None) -> None:
        self._link = link
        self._clock = reactor if clock is None else clock
        self._running: Set[Tuple[bytes, str, str]] = set()
        # Asked for while running (at most one each): run once more when the run ends.
        self._again: Dict[Tuple[bytes, str, str], Callable[[], defer.Deferred]] = {}
        self._tried: Dict[bytes, float] = {}  # when this worker last tried to resume a collection's builds
        self.steps = 0  # build steps this worker ran (a metric)

    def building(self, collection: bytes, index: Index) -> bool:
        """Whether this worker is building ``index`` of ``collection`` now."""
        return (collection, index.name, index.version) in self._running

    def resume_due(self, collection: bytes) -> bool:
        """Whether this worker should try to resume ``collection``'s builds now: once per lease's length.

        A query that meets an index unbuilt asks this first, so that clients
        polling during a build do not each make the worker give the shards
        their specs again and ask for the lease (18 Redis commands).
        """
        now = self._clock.seconds()
        if now - self._tried.get(collection, -LEASE_SECONDS) < LEASE_SECONDS:
            return False
        if len(self._tried) >= 1024:
            self._tried.clear()  # collections with indexes are an admin's few; this only bounds it
        self._tried[collection] = now
        return True

    def ensure(self, collection: bytes, indexes: Sequence[Index]) -> None:
        """Build (or go on building) each of ``indexes`` that this worker is not building already."""
        for index in indexes:
            self._start((collection, index.name, index.version), lambda index=index: self._build(collection, index))

    def sweep(self, collection: bytes) -> None:
        """Remove (or go on removing) the fields that dropped indexes left in ``collection``'s documents."""
        self._start((collection, SWEEP_NAME, ""), lambda: self._sweep(collection))

    @defer.inlineCallbacks
    def resume(self, collection: bytes, indexes: Sequence[Index]) -> Any:
        """Each of ``indexes``' progress, once the builds of those not built in every shard and the sweep of
        dropped ones go on from where they were (after a restart, a failover, a change made by the CLI)."""
        progress = (yield self.progress(collection, indexes)) if indexes else {}
        self.ensure(collection, [index for index in indexes if progress[index.name]["shards_built"] < _SHARDS])
        self.sweep(collection)
        return progress

    def _start(self, running: Tuple[bytes, str, str], work: Callable[[], defer.Deferred]) -> None:
        """``work``, or once more after the run under way: a change's second message may come while a build
        started by its first is past shards that had no spec yet. Its failure is logged (a later look resumes)."""
        if running in self._running:
            self._again[running] = work
            return
        self._running.add(running)
        started = work()
        started.addErrback(self._failed, running)
        started.addBoth(self._done, running)

    def _build(self, collection: bytes, index: Index) -> Any:
        """``BUILD`` steps over each shard in turn, under the index's lease."""
        lease = keys.index_build_lease_key(collection, index.name.encode(), index.version.encode())
        build_args: List[Any] = [index.name, index.version, STEP, STEP_BYTES]
        steps = [
            (BUILD, [keys.index_spec_key(collection, shard), keys.index_key(collection, shard)], build_args)
            for shard in range(_SHARDS)
        ]
        return self._leased(lease, steps)

    @defer.inlineCallbacks
    def _sweep(self, collection: bytes) -> Any:
        """``SWEEP`` steps over each dropped index's field in each shard that has one, under the collection's
        sweep lease."""
        dropped = [keys.index_dropped_key(collection, shard) for shard in range(_SHARDS)]
        fields = yield self._link.pipeline([(b"HKEYS", key) for key in dropped])
        steps = [
            (SWEEP, [key, keys.index_key(collection, shard)], [field, SWEEP_STEP])
            for shard, key in enumerate(dropped)
            for field in fields[shard]
        ]
        if steps:
            yield self._leased(keys.index_build_lease_key(collection, SWEEP_NAME.encode(), b""), steps)

    @defer.inlineCallbacks
    def _leased(self, lease: bytes, steps: Sequence[Tuple[Script, List[bytes], List[Any]]]) -> Any:
        """Each script call of ``steps`` again until it is done, paced, while this worker holds ``lease``."""
        holder = b"%d:%d" % (os.getpid(), id(self))
        taken = yield self._link.execute(b"SET", lease, holder, b"NX", b"EX", LEASE_SECONDS)
        if taken is None:
            return  # another worker does it, and renews its lease as it goes
        for script, step_keys, args in steps:
            done = 0
            while not done:
                started = self._clock.seconds()
                done, _ = yield self._link.run_script(script, step_keys, args)
                self.steps += 1
                renewed = yield self._link.run_script(_RENEW, [lease], [holder, LEASE_SECONDS])
                if not renewed:
                    return  # the lease ran out and another worker took the work over
                if not done:  # the others' turn: PAUSE times as long as this step took
                    yield task.deferLater(self._clock, (self._clock.seconds() - started) * PAUSE, lambda: None)
        yield self._link.run_script(_RELEASE, [lease], [holder])

    def _failed(self, failure: Any, running: Tuple[bytes, str, str]) -> None:
        # Redis away, or failing over: the next look at the index (a query, the settings) starts it again.
        _log.warn(
            "the {work} of {collection} stopped: {error}",
            work="sweep of dropped indexes" if running[1] == SWEEP_NAME else f"build of index {running[1]}",
            collection=running[0].decode(),
            error=failure.getErrorMessage(),
        )

    def _done(self, _: Any, running: Tuple[bytes, str, str]) -> None:
        self._running.discard(running)
        again = self._again.pop(running, None)
        if again is not None:
            self._start(running, again)

    def progress(self, collection: bytes, indexes: Sequence[Index]) -> defer.Deferred:
        """Each index's state: ``{"shards_built": n, "shards": 16}`` by name, from the shards' specs."""
        reads = [
            (b"HMGET", keys.index_states_key(collection, shard), *(_state_field(index) for index in indexes))
            for shard in range(keys.INDEX_SHARDS)
        ]
        return self._link.pipeline(reads).addCallback(_progress_of, indexes)


def _state_field(index: Index) -> bytes:
    return b"%s:%s" % (index.name.encode(), index.version.encode())


def _progress_of(states: Sequence[Any], indexes: Sequence[Index]) -> Dict[str, Dict[str, int]]:
    """Shards built per index, from each shard's states (``b"1"``: built)."""
    built = {index.name: sum(shard[at] == b"1" for shard in states) for at, index in enumerate(indexes)}
    return {name: {"shards_built": count, "shards": keys.INDEX_SHARDS} for name, count in built.items()}
