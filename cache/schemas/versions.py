"""A worker's compiled collection schemas: one per settings version, compiled off the reactor thread.

Compiling a schema (``cache.schemas.schema.compile_schema``) is CPU work that grows
with its size: ``jsonschema``'s meta-schema check alone takes seconds cold
for a schema near the size bound. On the reactor thread that
stopped the worker answering anything, ``/healthz`` included, for as long
(``loadtest/studies/_schema_stall.py`` measures it; ``docs/schemas.md`` has the
figures). So a compile runs in a thread of the reactor's pool: PyPy's GIL
hands the reactor back every ``sys.getswitchinterval()`` (5 ms). One compile
at a time per worker (``MAX_COMPILING``): a burst of new versions costs one
compile's memory and one core's share, queued, never many at once. What a
compile does is unchanged: nothing it runs reaches the network or a file
(``cache.schemas.bounds``).

Each version's outcome is kept, a refusal too (the ``InvalidSchema`` itself):
settings an earlier Jetway stored whose schema this one refuses (a remote
``$ref``, a cycle, a backreference, over 32 KiB…) are compiled once per
version and worker, then answered from memory (``cache.collection_settings``
turns the refusal into a 409 on each write). Callers asking for one version
while it compiles share that compile. Consistency: a version is an ETag,
and settings never change under an ETag, so an entry is true for as long
as it is kept; only the newest version of a collection is kept, and at most
``MAX_ENTRIES`` of them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.failure import Failure

from cache.fill_guard import MAX_ENTRIES, keep_bounded
from cache.schemas.schema import Compiled, CompiledSchema, InvalidSchema, compile_schema

MAX_COMPILING = 1
_log = Logger()
Runner = Callable[..., defer.Deferred]


class SchemaVersions:
    """Compiled schemas (or their refusals) by ``(collection, settings ETag)``, compiled in turn off the reactor."""

    def __init__(self, reactor: Any, run: Optional[Runner] = None, limit: int = MAX_ENTRIES) -> None:
        """``run(function, *args)`` runs ``function`` off the reactor thread (default: the reactor's pool)."""
        self._run = run or (
            lambda function, *args: threads.deferToThreadPool(reactor, reactor.getThreadPool(), function, *args)
        )
        self._outcomes: Dict[Tuple[str, bytes], Compiled] = {}
        self._waiting: Dict[Tuple[str, bytes], List[defer.Deferred]] = {}
        self._turns = defer.DeferredSemaphore(MAX_COMPILING)
        self._limit = limit
        self.compiles = 0  # how many compiles this worker ran (tests: one per version)

    def compile(self, schema: Any) -> defer.Deferred:
        """``schema`` compiled in turn, off the reactor: a ``CompiledSchema``, or failing with ``InvalidSchema``."""
        return self._turns.run(self._compile, schema).addCallback(_raised)

    def outcome(self, name: str, etag: bytes, schema: Any) -> defer.Deferred:
        """This version's ``Compiled``: from memory once known, else one compile however many ask meanwhile."""
        key = (name, etag)
        known = self._outcomes.get(key)
        if known is not None:
            return defer.succeed(known)
        answer: defer.Deferred = defer.Deferred()
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.append(answer)
            return answer
        self._waiting[key] = [answer]  # before the compile starts: it may end at once
        self._turns.run(self._compile, schema).addCallback(self._compiled, key)
        return answer

    def remember(self, name: str, etag: bytes, compiled: Compiled) -> None:
        """Keep ``compiled`` as the collection's version ``etag``; an older version is never asked for again."""
        for key in [key for key in self._outcomes if key[0] == name and key[1] != etag]:
            del self._outcomes[key]
        keep_bounded(self._outcomes, (name, etag), compiled, self._limit)

    def _compiled(self, compiled: Compiled, key: Tuple[str, bytes]) -> None:
        self.remember(*key, compiled)
        for answer in self._waiting.pop(key):
            answer.callback(compiled)

    def _compile(self, schema: Any) -> defer.Deferred:
        self.compiles += 1
        return self._run(_compile, schema).addErrback(_failed)


def _compile(schema: Any) -> Compiled:
    """In the thread: the schema compiled, or why not."""
    try:
        return compile_schema(schema)
    except InvalidSchema as error:
        return error


def _failed(failure: Failure) -> InvalidSchema:
    """Anything else a compile raised (a bug, or a bound missed): a refusal, kept like one, never retried per write."""
    _log.failure("compiling a collection schema failed", failure)
    return InvalidSchema(f"the schema could not be compiled ({failure.type.__name__})")


def _raised(compiled: Compiled) -> CompiledSchema:
    if isinstance(compiled, InvalidSchema):
        raise compiled
    return compiled
