"""``JETWAY_DEBUG_BURN_US``: CPU burnt on every request, for testing the load-test gate only.

``make loadtest-check`` must fail on a real slowdown; this makes one on
demand (docs/testing.md, "The baseline and the gate"). Off (0) by default; never set
it in production.
"""

from __future__ import annotations

import time


def burn_cpu(seconds: float) -> None:
    """Spin until this process has used ``seconds`` more of CPU time (not wall time: a busy machine
    would otherwise make the burn smaller)."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass
