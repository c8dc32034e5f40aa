"""Declared indexes reach the shards, and are built over the documents already there, in steps.

``apply_specs`` gives every index shard of a collection the spec of its
declared indexes, ordered by the settings' generation (a later settings
change is never undone by an earlier one's spec arriving late). From the
moment a shard holds an index's spec, each write's script keeps the index
for the document it writes (``cache.index_scripts``).

``IndexBuilds`` indexes the documents written before, shard by shard, in
``BUILD`` steps of ``STEP`` documents (each one script call of a ms or
two), one step in flight per index, and a pause after each (``PAUSE``)
so that reads and writes keep most of Redis and of the worker. The
position is kept in the shard's spec, so a build is resumed by whoever
calls ``ensure`` next: the worker that stored the settings, or any
worker whose query met the index unbuilt (a restart, a failover, a worker
that died mid-build). Two workers building one index at once do it twice,
not wrongly: a step sets each document's entry from its stored bytes, in
the same script as it reads them.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Set, Tuple

from twisted.internet import defer, reactor, task
from twisted.logger import Logger

from cache import keys
from cache.index_scripts import BUILD, SPEC
from cache.indexes import Index, spec_json
from cache.redis.link import Link

# Documents per build step, ~1-2 ms of Redis for small documents, and its bytes for large ones (Redis
# decodes each, ~1 ms a MiB): a step holds every other command for as long as it runs.
STEP = 128
STEP_BYTES = 256 * 1024
# After each step the build waits this many times as long as the step took: its share of Redis, and of the
# worker. Unpaced, one shard at a time in steps of 256 documents, a build of 1,000,000 documents took 15 s
# and left PUTs at 0.49x their rate meanwhile; in steps of 64, 18.5 s and 0.65x; steps of 128 paced 2x,
# 63 s and 0.75x (reads 0.77x) (loadtest/_queries.py).
PAUSE = 3.0
_log = Logger()


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
        self.steps = 0  # build steps this worker ran (a metric)

    def building(self, collection: bytes, index: Index) -> bool:
        """Whether this worker is building ``index`` of ``collection`` now."""
        return (collection, index.name, index.version) in self._running

    def ensure(self, collection: bytes, indexes: Sequence[Index]) -> None:
        """Build (or go on building) each of ``indexes`` that this worker is not building already."""
        for index in indexes:
            running = (collection, index.name, index.version)
            if running not in self._running:
                self._running.add(running)
                building = self._build(collection, index)
                building.addErrback(self._failed, collection, index)
                building.addBoth(self._done, running)

    @defer.inlineCallbacks
    def _build(self, collection: bytes, index: Index) -> Any:
        for shard in range(keys.INDEX_SHARDS):
            spec_key, ids_key = keys.index_spec_key(collection, shard), keys.index_key(collection, shard)
            done = 0
            while not done:
                started = self._clock.seconds()
                done, _ = yield self._link.run_script(
                    BUILD, [spec_key, ids_key], [index.name, index.version, STEP, STEP_BYTES]
                )
                self.steps += 1
                if not done:  # the others' turn: PAUSE times as long as this step took
                    yield task.deferLater(self._clock, (self._clock.seconds() - started) * PAUSE, lambda: None)

    def _failed(self, failure: Any, collection: bytes, index: Index) -> None:
        # Redis away, or failing over: the next query that meets the index unbuilt starts it again.
        _log.warn(
            "the build of index {name} of {collection} stopped: {error}",
            name=index.name,
            collection=collection.decode(),
            error=failure.getErrorMessage(),
        )

    def _done(self, _: Any, running: Tuple[bytes, str, str]) -> None:
        self._running.discard(running)

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
