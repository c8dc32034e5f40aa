"""Work over many items in slices of bounded time, the reactor served between them.

A worker serves every client from one thread: a loop over the 1,000
operations of a batch (checking, planning, preparing, rendering each) that
runs in one go holds every other client of the worker for as long as it
takes, a large part of a second per loop under load (issue #44: ``/healthz``
stalled behind one batch; docs/limits.md, "The batch attack, after").
``in_turns`` does the items in
order and, once a slice has taken ``SLICE_SECONDS``, goes on in a later
reactor turn (``callLater(0)``: the reactor polls its sockets before timed
calls run again), so the worker answers others in between. A short list
(the usual batch) is done at once, with no turn given up and no timer.
An item known to be long (``pause_after``: a merge of a 1 MiB document,
milliseconds of CPU, many times that on a loaded machine) ends its slice at once:
one such item per turn, never two back to back.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, List, Optional, TypeVar

from twisted.internet import defer

Item = TypeVar("Item")
Result = TypeVar("Result")

# The work one turn may do before the others get theirs: well under the
# 100 ms the issue allows a /healthz to wait, on a busy 2-core machine.
SLICE_SECONDS = 0.01


def in_turns(
    clock: Any,
    items: Iterable[Item],
    work: Callable[[Item], Result],
    slice_seconds: float = SLICE_SECONDS,
    timer: Callable[[], float] = time.perf_counter,
    pause_after: Optional[Callable[[Item], bool]] = None,
) -> defer.Deferred:
    """Fires with ``[work(item) for item in items]``, done in order, a slice per reactor turn.

    ``pause_after(item)`` true: the slice ends after that item (asked after its work).

    An exception from ``work`` fails the Deferred; the items after it are not done.
    """
    pending = list(items)
    results: List[Any] = []
    done = defer.Deferred()

    def run_slice() -> None:
        deadline = timer() + slice_seconds
        try:
            while len(results) < len(pending):
                item = pending[len(results)]
                results.append(work(item))
                done_now = timer() > deadline or (pause_after is not None and pause_after(item))
                if done_now and len(results) < len(pending):
                    clock.callLater(0, run_slice)
                    return
        except Exception:
            done.errback()
            return
        done.callback(results)

    run_slice()
    return done
