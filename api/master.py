"""The master process: binds the sockets, runs the workers, keeps them alive.

Each worker slot has its own ``SO_REUSEPORT`` socket (``api.sockets``) that
the master holds for its whole life and hands to the slot's worker as fd 3.
A worker says it is serving by writing ``ready`` on fd 4. Its stdout is a
pipe the master reads and passes on, whole lines only, to its own stdout
(``api.log_relay``).

- A worker that dies is restarted on the same socket; one that dies soon
  after starting is restarted after a growing back-off, so a crash loop
  does not spin. Until its successor serves, new connections go to the
  slots whose workers serve (``api.steering``), and those its socket had
  queued are handed to them (``api.handoff``); at start, new connections
  go to the workers ready so far.
- SIGTERM/SIGINT: every worker drains (see ``api.worker``); the master exits
  0 once they have, killing any still alive ``grace`` + 5 s later.
- SIGHUP: the workers are replaced one slot at a time; the new worker is
  serving on the slot's socket before the old one is told to drain, so no
  connection is refused. Workers are spawned with SIGHUP held and ignore
  it (``api.signals``): a hangup of the whole process group (a closing
  terminal) reloads, it does not empty the slots. A SIGHUP during a reload
  is remembered, and another reload follows the one under way (any number
  of them during one reload make one more), so the code deployed last is
  what serves.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any, Dict, List, Mapping, Optional

from prometheus_client import multiprocess
from twisted.internet import defer, protocol
from twisted.logger import Logger

from api.handoff import HANDOFF_FD, channel_pair, hand_over_queued
from api.log_relay import Relay
from api.metrics_dir import MULTIPROC_ENV
from api.observe import worker_restarts
from api.signals import dump_stacks_on, hangups_held, on_signals, stop_reactor
from api.steering import steer

LOG_FD = 1
LISTEN_FD = 3
READY_FD = 4
# A worker that dies sooner than this after starting counts as crashing.
STABLE_AFTER = 5.0
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 10.0
READY_TIMEOUT = 60.0
KILL_AFTER_GRACE = 5.0
# Its lines: info for what it starts and stops, a warning where an operator
# should look (a worker died, steering failed, a reload stopped).
_log = Logger()
# PyPy's GC settings for the workers, unless the environment names its own.
# The nursery: PyPy sizes it from the CPU's cache (small on this machine),
# and a read allocates tens of KB, so a small nursery collects every few
# requests; each minor collection copies what the requests in flight hold,
# so fewer collections copy less. The major collection threshold (PyPy's default
# 1.82): 1.5 keeps a worker's heap, and so its resident memory, smaller at
# no CPU cost seen. The increment step: PyPy's default (twice the nursery)
# made marking steps long enough to be the read path's p99, and 4 MB steps
# were still the PUT's: 2 MB makes each step shorter, twice as many, at the
# same share of CPU. The figures behind each:
# docs/performance.md, "PyPy's garbage collector" and "Where a slow PUT's
# time goes".
DEFAULT_GC_ENVIRONMENT = {
    "PYPY_GC_NURSERY": "8MB",
    "PYPY_GC_MAJOR_COLLECT": "1.5",
    "PYPY_GC_INCREMENT_STEP": "2MB",
}


class WorkerProcess(protocol.ProcessProtocol):
    """One worker child; ``ready`` and ``ended`` fire as their names say."""

    def __init__(self, slot: Slot, started: float) -> None:
        self.slot = slot
        self.started = started
        self.pid = 0
        self.ready: defer.Deferred = defer.Deferred()
        self.channel, self.channel_end = channel_pair()  # api.handoff: ours, and the worker's HANDOFF_FD
        self.ended: defer.Deferred = defer.Deferred()

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD == READY_FD and b"ready" in data and not self.ready.called:
            self.ready.callback(self)

    def processEnded(self, reason: Any) -> None:
        if not self.ready.called:
            self.ready.errback(RuntimeError(f"worker exited before it was ready: {reason.value}"))
        self.channel.close()
        self.ended.callback(reason.value)
        self.slot.master.worker_ended(self, reason.value)

    def signal(self, name: str) -> None:
        if self.transport is not None and self.transport.pid is not None:
            self.transport.signalProcess(name)


class Slot:
    """A worker position: its socket, its current worker, its back-off."""

    def __init__(self, master: Master, index: int, listener: socket.socket) -> None:
        self.master = master
        self.index = index
        self.listener = listener
        self.worker: Optional[WorkerProcess] = None
        self.serving: Optional[WorkerProcess] = None  # the worker that said ready, until it dies
        self.backoff = 0.0


def worker_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """The master's environment, with PyPy's GC settings added where the operator chose none."""
    return {**DEFAULT_GC_ENVIRONMENT, **environ}


class Master:
    def __init__(
        self,
        listeners: List[socket.socket],
        reactor: Any,
        grace: float,
        relay: Relay,
        python: str = sys.executable,
        url: str = "",
    ):
        self.reactor = reactor
        self.url = url  # where it serves, for its lines
        self.grace = grace
        self.relay = relay
        self.python = python
        self.slots = [Slot(self, index, listener) for index, listener in enumerate(listeners)]
        self.stopping = False
        self.reloading = False
        # A SIGHUP came during the reload under way: the workers it started may run older code.
        self.reload_again = False
        self.restarts = worker_restarts()
        self.steering_failed = False
        self.all_served = False  # every slot's first worker has said it serves

    def run(self) -> int:
        # SIGHUP at once (Twisted never sets it): one during the first spawns reloads, it does not kill.
        # SIGTERM/SIGINT once running: Twisted sets its own as it starts.
        on_signals(self.reactor, self.reload, signal.SIGHUP)
        dump_stacks_on(signal.SIGUSR2)
        for slot in self.slots:
            self.spawn(slot)
        self.reactor.callWhenRunning(on_signals, self.reactor, self.shutdown, signal.SIGTERM, signal.SIGINT)
        self.reactor.run()
        for slot in self.slots:
            slot.listener.close()
        self.relay.close(KILL_AFTER_GRACE)
        return 0

    def spawn(self, slot: Slot) -> WorkerProcess:
        worker = WorkerProcess(slot, self.reactor.seconds())
        args = [self.python, "-m", "api", "worker", "--fd", str(LISTEN_FD), "--ready-fd", str(READY_FD)]
        args += ["--handoff-fd", str(HANDOFF_FD), "--slot", str(slot.index)]
        if self.relay.to_file:
            # The master's stdout is a file: the worker writes its whole lines there itself (api.log_relay).
            return self._spawn(slot, worker, args, LOG_FD)
        # The worker's stdout: a pipe the relay reads on its own schedule (api.log_relay).
        log_read, log_write = os.pipe()
        try:
            self._spawn(slot, worker, [*args, "--log-pipe"], log_write)
        except BaseException:
            os.close(log_read)
            raise
        finally:
            os.close(log_write)
        self.relay.watch(worker, log_read)
        return worker

    def _spawn(self, slot: Slot, worker: WorkerProcess, args: List[str], stdout: int) -> WorkerProcess:
        fds = {0: "w", LOG_FD: stdout, 2: 2, LISTEN_FD: slot.listener.fileno(), READY_FD: "r"}
        try:
            with hangups_held():  # the worker ignores SIGHUP once it runs; held until then
                worker.pid = self.reactor.spawnProcess(
                    worker,
                    self.python,
                    args,
                    env=worker_environment(os.environ),
                    childFDs={**fds, HANDOFF_FD: worker.channel_end.fileno()},
                ).pid
        finally:
            worker.channel_end.close()  # the worker's copy is its own
        worker.ready.addErrback(
            lambda failure: _log.warn("slot {slot}: {why}", slot=slot.index, why=failure.getErrorMessage())
        )
        worker.ready.addCallback(self._now_serving, worker)
        slot.worker = worker
        return worker

    def _now_serving(self, result: Any, worker: WorkerProcess) -> Any:
        if result is worker and worker.slot.worker is worker:
            worker.slot.serving = worker
            self._steer()
            if not self.all_served and all(slot.serving is not None for slot in self.slots):
                self.all_served = True
                _log.info("jetway: serving on {url} with {workers}", url=self.url, workers=self._workers())
        return result

    def _workers(self) -> str:
        return f"{len(self.slots)} worker{'s' if len(self.slots) != 1 else ''}"

    def _steer(self) -> None:
        """New connections to the slots whose workers serve (``api.steering``)."""
        serving = [slot.index for slot in self.slots if slot.serving is not None]
        try:
            steer(self.slots[0].listener, len(self.slots), serving)
        except OSError as error:
            if not self.steering_failed:  # once: connections then wait for a slot's worker, as before
                _log.warn("cannot steer new connections away from a slot without a worker: {error}", error=error)
            self.steering_failed = True

    def worker_ended(self, worker: WorkerProcess, reason: Any) -> None:
        if os.environ.get(MULTIPROC_ENV):
            # Its live gauges (open connections) no longer count.
            multiprocess.mark_process_dead(worker.pid)
        slot = worker.slot
        if slot.worker is not worker or self.stopping:
            return  # replaced by a reload, or shutting down
        slot.worker = None
        slot.serving = None
        self._steer()
        self._hand_over(slot)
        lived = self.reactor.seconds() - worker.started
        slot.backoff = 0.0 if lived >= STABLE_AFTER else min(max(slot.backoff * 2, FIRST_BACKOFF), MAX_BACKOFF)
        _log.warn(
            "worker of slot {slot} ended (pid {pid}: {reason}); restarting in {backoff:.1f}s",
            slot=slot.index,
            pid=worker.pid,
            reason=reason,
            backoff=slot.backoff,
        )
        self.restarts.inc()
        self.reactor.callLater(slot.backoff, self._respawn, slot)

    def _hand_over(self, slot: Slot) -> None:
        """What the dead worker's socket had queued goes to the serving workers (``api.handoff``)."""
        channels = [other.serving.channel for other in self.slots if other.serving is not None]
        if channels:
            handed = hand_over_queued(slot.listener, channels)
            if handed:
                _log.info(
                    "slot {slot}: {handed} queued connections handed to the serving workers",
                    slot=slot.index,
                    handed=handed,
                )

    def _respawn(self, slot: Slot) -> None:
        if not self.stopping and slot.worker is None:
            self.spawn(slot)

    def reload(self) -> None:
        """Replace the workers one slot at a time (SIGHUP); during a reload, once more after it."""
        if self.stopping:
            return
        if self.reloading:
            if not self.reload_again:
                _log.info("reload asked during a reload: another follows this one")
            self.reload_again = True
            return
        self._replace_workers()

    @defer.inlineCallbacks
    def _replace_workers(self) -> Any:
        self.reloading = True
        _log.info("reloading: replacing workers one at a time")
        try:
            for slot in self.slots:
                old = slot.worker
                new = self.spawn(slot)
                try:
                    yield new.ready.addTimeout(READY_TIMEOUT, self.reactor)
                except Exception as error:
                    _log.warn(
                        "reload stopped at slot {slot}: the new worker did not start ({error})",
                        slot=slot.index,
                        error=error,
                    )
                    slot.worker = old
                    new.signal("KILL")
                    return
                if old is not None:
                    old.signal("TERM")
                    yield old.ended
            _log.info("reloaded: {workers} replaced", workers=self._workers())
        finally:
            self.reloading = False
            # Also after a failed reload: the later SIGHUP may be the deploy that fixes it.
            if self.reload_again and not self.stopping:
                self.reload_again = False
                self.reactor.callLater(0, self.reload)

    def shutdown(self) -> None:
        """Drain every worker, then stop (SIGTERM/SIGINT)."""
        if self.stopping:
            return
        self.stopping = True
        _log.info("draining workers")
        workers = [slot.worker for slot in self.slots if slot.worker is not None]
        for worker in workers:
            worker.signal("TERM")
        killing = self.reactor.callLater(self.grace + KILL_AFTER_GRACE, self._kill, workers)
        done = defer.DeferredList([worker.ended for worker in workers])
        done.addCallback(lambda _: killing.cancel() if killing.active() else None)
        done.addCallback(lambda _: _log.info("workers drained; stopping"))
        done.addCallback(lambda _: stop_reactor(self.reactor))

    def _kill(self, workers: List[WorkerProcess]) -> None:
        for worker in workers:
            if not worker.ended.called:
                _log.warn("worker {pid} outlived the grace period; killing it", pid=worker.pid)
                worker.signal("KILL")
