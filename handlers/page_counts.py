"""A page's count in its headers, as PostgREST gives it: ``Content-Range: 0-19/3573`` and ``Preference-Applied``.

The count (``cache.indexes.counts``) is read beside the page, both in
flight at once, so a counted page takes one round trip more of Redis's
time, not of the client's. The first number is the page's first position
in the whole answer: the documents before the cursor, counted with the
total; ``*/3573`` is an empty page's (``*/0``: nothing matches).

The count and the page are read by different scripts, so under racing
writes they may disagree by the documents that moved in between: the range
is then kept inside the total (the first position lowered, or the total
raised to the page's own number of documents), so the header is always
well formed and the total never below what the page shows.
"""

from __future__ import annotations

from typing import Any, List

from twisted.internet import defer

from cache.indexes.counts import Count


def content_range(count: Count, answered: int) -> str:
    """The ``Content-Range`` of a page of ``answered`` documents: ``first-last/total`` (``*/total`` when empty)."""
    total = max(count.total, answered)
    if not answered:
        return f"*/{total}"
    first = min(count.before, total - answered)
    return f"{first}-{first + answered - 1}/{total}"


def both(reading: defer.Deferred, counting: defer.Deferred) -> defer.Deferred:
    """``[page, count]`` once both have fired; the first failure (as itself) if either fails, the other's
    consumed (an unhandled failure would be logged)."""
    together = defer.DeferredList([reading, counting], fireOnOneErrback=True, consumeErrors=True)
    return together.addCallbacks(_results, _first_failure)


def _results(outcomes: List[Any]) -> List[Any]:
    return [result for _, result in outcomes]


def _first_failure(failure: Any) -> Any:
    return failure.value.subFailure  # DeferredList's FirstError: the failure it wraps, raised again
