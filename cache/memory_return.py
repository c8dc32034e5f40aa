"""Memory given back to the system after a large answer, in steps of bounded time.

An answer composed of many documents (a batch's, up to
``JETWAY_MAX_RESPONSE_BYTES``) makes objects of many MiB. Two things kept
their memory from the system long after they were sent (issue #44: a
worker stayed tens of MB larger long after a 16 MiB batch answer;
docs/limits.md, "The batch attack, after"):

- PyPy frees an object of that size only when a major collection ends,
  and its incremental collector moves on only as the program allocates:
  an idle worker finished the collection seconds later, if at all;
- glibc's ``free`` keeps a large block in the heap once its threshold for
  mapping blocks of their own has grown past that size (it grows to the
  largest block freed), so the heap shrinks only when its top is free.

So, a second after a large answer (it has been sent by then, or is held by
a slow client under ``JETWAY_SEND_TIMEOUT``), ``MemoryReturn`` runs PyPy's
collector one step per reactor turn (``gc.collect_step``, a few ms each)
until a major collection ends, then ``malloc_trim(0)`` gives back the free
pages of the heap (a few ms). Several large answers share one pass.

Batches sent back to back never leave a second idle: the collector ran
only as they allocated, and a worker grew by many times each
1,000-operation batch's bytes (a 1.4 MiB body and answer) before its major
collections caught up. So a batch of at least ``STEP_BATCH`` bytes (body
and answer) is also followed, in the next reactor turn, by one collector
step, and the rise stays near the batch's own bytes
(``loadtest/studies/_batch_pace.py``; docs/performance.md, "Batches").
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Callable, Optional

# An answer at least this large is followed by a pass (a page of 100 small documents is far below).
LARGE_ANSWER = 4 * 1024 * 1024
# How long after the answer the pass starts: its bytes are sent by then on any ordinary connection.
DELAY_SECONDS = 1.0
# A batch this large (its body and answer) is followed by one collector step.
STEP_BATCH = 256 * 1024
# Steps of one pass at most (a major collection of a worker's heap took 3-12 here).
MAX_STEPS = 200


def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's ``malloc_trim``, or None where there is none (musl, macOS)."""
    try:
        # The process's own symbols: ctypes.util.find_library runs ldconfig in a subprocess (seconds, here).
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError, TypeError):
        return None


def give_back() -> None:
    """The heap's free pages back to the system now (``malloc_trim``; nothing where there is none)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class MemoryReturn:
    """Gives a large answer's memory back to the system soon after it is sent."""

    def __init__(self, clock: Any, large: int = LARGE_ANSWER, delay: float = DELAY_SECONDS) -> None:
        self._clock = clock
        self._large = large
        self._delay = delay
        self._pending: Optional[Any] = None
        self._trim = _malloc_trim()
        self.passes = 0  # passes completed (for tests)
        self._stepping: Optional[Any] = None
        self.steps = 0  # single steps after batches (for tests)

    def after_answer(self, size: int) -> None:
        """An answer of ``size`` bytes was made; a large one is followed by a pass, unless one is due."""
        if size >= self._large and self._pending is None:
            self._pending = self._clock.callLater(self._delay, self._step, 0)

    def after_batch(self, size: int, answer: int) -> None:
        """A batch of ``size`` bytes (body and answer) answered ``answer`` bytes: one step at once if it is large."""
        self.after_answer(answer)
        if size >= STEP_BATCH and self._stepping is None:
            self._stepping = self._clock.callLater(0, self._one_step)

    def _one_step(self) -> None:
        self._stepping = None
        collect_step = getattr(gc, "collect_step", None)
        if collect_step is not None:
            collect_step()
        self.steps += 1

    def _step(self, steps: int) -> None:
        collect_step = getattr(gc, "collect_step", None)  # PyPy's; CPython frees at once
        if collect_step is not None and steps < MAX_STEPS and not collect_step().major_is_done:
            self._pending = self._clock.callLater(0, self._step, steps + 1)
            return
        if self._trim is not None:
            self._trim(0)
        self._pending = None
        self.passes += 1
