"""Signal handling for processes that run a Twisted reactor.

Who does what (docs/json-and-signals.md has the whole table):

- SIGHUP is the master's alone: it replaces the workers one at a time. A
  closing terminal sends it to the whole process group (``kill -HUP
  -PGID``), workers included; a worker that died of it left its slot empty
  while the master was still starting the replacement (both slots empty,
  a PUT waited seconds). So a worker ignores SIGHUP, and it is born with
  SIGHUP blocked (``hangups_held`` around the spawn; a blocked signal stays
  pending across exec, and Twisted resets only ignored ones), so not even a
  worker still starting can die of one.
- SIGTERM/SIGINT: the master drains its workers; a worker drains itself.
- SIGUSR2: a worker writes every thread's Python stack to its stderr
  (``dump_stacks_on``), at once, also when its reactor is stuck: the
  handler is the interpreter's own (``faulthandler``), so none of the
  worker's code has to run for it. A worker that stops answering can then
  say where it is.
- The reactor is stopped through ``stop_reactor``: a second stop (a drain
  that ends as a warm-up fails, a signal after the last tick) raised
  ``ReactorNotRunning``, logged as a critical traceback.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
from typing import Any, Callable, Iterator

from twisted.internet.error import ReactorNotRunning


def on_signals(reactor: Any, handler: Callable[[], None], *signals: int) -> None:
    """Call ``handler`` in the reactor thread when any of ``signals`` arrives.

    Called once the reactor runs, it replaces Twisted's own SIGTERM/SIGINT
    handlers (which stop the reactor at once, cutting requests off).
    """
    for signum in signals:
        signal.signal(signum, lambda *_: reactor.callFromThread(handler))


@contextlib.contextmanager
def hangups_held() -> Iterator[None]:
    """Block SIGHUP in this thread for the ``with`` block: a child spawned inside starts with it blocked.

    One that arrives meanwhile is delivered to this process when the block ends.
    """
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def ignore_hangups() -> None:
    """Ignore SIGHUP from now on (a worker), discarding one held since the spawn (``hangups_held``)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


def stop_reactor(reactor: Any) -> None:
    """Stop ``reactor`` unless it is already stopping."""
    with contextlib.suppress(ReactorNotRunning):
        reactor.stop()


def dump_stacks_on(signum: int = signal.SIGUSR2) -> None:
    """``signum`` writes every thread's stack to stderr from now on (``kill -USR2 <worker pid>``); the process
    goes on as before."""
    faulthandler.register(signum, file=sys.stderr, all_threads=True)
