"""The rule of every cache that is filled from Redis and invalidated by messages, kept in one place.

A worker's cache of this kind (``cache.credentials.token_cache``, ``cache.settings_cache``)
reads Redis on one connection and hears invalidations on another (a
pub/sub subscription). Nothing orders the two: a reply that left Redis
before a change can arrive after the change's message. So:

1. **Trusted only while subscribed.** An entry is used only while the
   subscription is up. Its loss, and its coming back, empty the cache;
   while it is down every lookup reads Redis.
2. **A fill that an invalidation overtook is refused.** A read takes a
   ticket (the guard's generation) when it is sent; every invalidation
   message, and the subscription's loss or return, moves the generation
   on; a reply that comes back under another generation is answered to
   its caller (it was true when Redis sent it) but never kept.

Rule 2 is by generation, not by key: one invalidation voids every fill in
flight. Both caches change rarely (a revocation, a settings write), so a
few lookups more after a change cost nothing. ``cache.hot.cache`` keeps
the same rule per key (its ``reserve``/``fill`` tickets, with a floor for
losses and flushes), because documents change all the time.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

# The bound on every such cache; beyond it the oldest entries go (dicts keep order).
MAX_ENTRIES = 10_000


def keep_bounded(entries: Dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """Store ``key``; a new key beyond ``limit`` entries pushes out the oldest (dicts keep order)."""
    if key not in entries and len(entries) >= limit:
        entries.pop(next(iter(entries)))
    entries[key] = value


class FillGuard:
    """Whether a cache may keep a reply: subscribed now, and no invalidation since the read was sent.

    ``source`` is the subscription that keeps the cache true (its protocol),
    None while there is none; a cache's fast path reads it directly.
    """

    __slots__ = ("generation", "source")

    def __init__(self) -> None:
        self.generation = 0
        self.source: Optional[Any] = None

    def ticket(self) -> int:
        """Taken when a read is sent; ``may_keep`` its reply only with it."""
        return self.generation

    def may_keep(self, ticket: int) -> bool:
        """Whether a reply to a read sent under ``ticket`` may be cached (rule 2)."""
        return self.source is not None and ticket == self.generation

    def invalidated(self) -> None:
        """An invalidation message arrived: every read in flight is overtaken."""
        self.generation += 1

    def up(self, source: Any) -> None:
        """``source`` is subscribed: reads sent before now may predate a message it never heard."""
        self.source = source
        self.generation += 1

    def down(self, source: Any) -> None:
        """``source`` is gone (or failed to subscribe); a newer one, if any, stays."""
        if self.source is source:
            self.source = None
        self.generation += 1
