"""A ``Link`` made on first use: the write pool for a collection's own write concern.

With ``JETWAY_WRITE_REPLICAS=0`` a worker needs no write pool, until a
collection's settings ask for ``write_replicas``; then its writes (and
their ``WAIT``) need a pool of their own, as in ``cache.documents.write_concern``.
Dialling it only then keeps every other deployment at one pool per worker.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from twisted.internet import defer

from cache.redis.link import Arg, Command, Link
from cache.redis.script import Script


class LazyLink:
    """Forwards to ``make()``'s link, made at the first call."""

    def __init__(self, make: Callable[[], Link]) -> None:
        self._make = make
        self._link: Optional[Link] = None

    def dial(self) -> None:
        """Make the link now rather than at the first call."""
        self._target()

    def _target(self) -> Link:
        if self._link is None:
            self._link = self._make()
        return self._link

    def execute(self, *command: Arg) -> defer.Deferred:
        return self._target().execute(*command)

    def pipeline(self, commands: Sequence[Command]) -> defer.Deferred:
        return self._target().pipeline(commands)

    def pipeline_scripts(self, commands: Sequence[Command], scripts: Sequence[Script]) -> defer.Deferred:
        return self._target().pipeline_scripts(commands, scripts)

    def pipeline_outcomes(
        self, commands: Sequence[Command], scripts: Sequence[Script], wait: Optional[Command] = None
    ) -> defer.Deferred:
        return self._target().pipeline_outcomes(commands, scripts, wait)

    def run_script(self, script: Script, keys: Sequence[bytes], args: Sequence[Arg]) -> defer.Deferred:
        return self._target().run_script(script, keys, args)

    def run_script_waiting(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Arg], wait: Command
    ) -> defer.Deferred:
        return self._target().run_script_waiting(script, keys, args, wait)

    def close(self) -> Any:
        return self._link.close() if self._link is not None else defer.succeed(None)
