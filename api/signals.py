"""Signal handling for processes that run a Twisted reactor."""

from __future__ import annotations

import signal
from typing import Any, Callable


def on_signals(reactor: Any, handler: Callable[[], None], *signals: int) -> None:
    """Call ``handler`` in the reactor thread when any of ``signals`` arrives.

    Called once the reactor runs, it replaces Twisted's own SIGTERM/SIGINT
    handlers (which stop the reactor at once, cutting requests off).
    """
    for signum in signals:
        signal.signal(signum, lambda *_: reactor.callFromThread(handler))
