"""A worker's hot cache of documents, bounded in bytes, kept true by Redis.

It holds ``cache.documents.store.Document`` objects exactly as the store returned them,
by their Redis key, least recently used out first. Its consistency rule:

- An entry exists only while the invalidation feed (``cache.hot.tracking``: a
  connection per Redis master that Redis tells of every change to a document
  key) is up. When the feed goes down, or the topology it watches changes,
  every entry is dropped and none is made until it is up again.
- An invalidation drops the key's entry; a null one (``FLUSHALL``,
  ``FLUSHDB``) drops them all. A write by this worker drops its own entry
  before the write is answered (``DocumentStore``), so the worker reads its
  own writes at once; other workers within the invalidation's delay.
- A read fills only if nothing could have changed the key between the moment
  it was sent and the moment its reply came: the read takes a ticket when it
  is sent (``reserve``), and its reply is refused (``fill``) when an
  invalidation of that key, a write by this worker, the loss of the feed, a
  flush or a topology change came in between. Invalidations arrive on another
  connection than replies, so either may come first.
- An entry is served only while the invalidations are known to be at most
  ``max_lag`` behind (``confirm``): the feed's heartbeat (``cache.hot.tracking``)
  says up to which moment every invalidation has arrived, and past that
  moment plus ``max_lag`` a hit is refused and the read goes to Redis, as
  when the feed is down. So a document served from the cache was current at
  some moment within ``max_lag`` before it is served, however late the
  invalidations come (docs/operations.md, "The hot cache").
- An entry carries the key's expiry (``PTTL``, read with the body) and is not
  served past it: Redis may delete an expired key much later (its active
  expiry samples keys), and only then sends the invalidation.

A document larger than ``1/MAX_ENTRY_SHARE`` of the bound is never cached,
so a few large documents cannot push out every small one. A miss fills only
when its key was read at least twice lately and, once the cache is full,
more often lately than the least recently used entry it would push out, by
more than one read (``cache.hot.admission``, TinyLFU): a document read once costs what it costs
without the cache, and more documents read in turn or at random than the
cache holds do not churn it (docs/operations.md, "The hot cache").
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Optional

from cache.hot.admission import FrequencySketch

# A worker's memory grows by more than its entries hold: PyPy collects its
# old generation only once it has grown to PYPY_GC_MAJOR_COLLECT (1.5) times
# what survived the collection before, and evicted entries wait for that
# collection. So the bound is on what the cache adds to a worker's memory,
# and the entries themselves keep to bound / HEAP_GROWTH, the growth measured
# (docs/performance.md, "Memory").
HEAP_GROWTH = 2.4
# The largest entry, as a share of the entries' bytes.
MAX_ENTRY_SHARE = 64
# What an entry costs beyond its bytes: the Document and entry objects, the
# bytes objects' headers and the dict slot (PyPy; docs/performance.md, "Memory").
ENTRY_OVERHEAD = 256
# The reads after which the admission's sketch is reset (its counts halve),
# per entry the cache holds (TinyLFU's choice), and at least.
SAMPLE_PER_ENTRY = 10
MIN_SAMPLE = 16_384
# PTTL's answers besides a number of milliseconds.
_NO_EXPIRY, _NO_KEY = -1, -2
_ALWAYS, _NEVER = float("inf"), float("-inf")


def _nothing() -> None:
    """No heartbeat to wake (a cache without a feed)."""


class _Entry:
    __slots__ = ("document", "expires", "size")

    def __init__(self, document: Any, size: int, expires: float) -> None:
        self.document = document
        self.size = size
        self.expires = expires  # on the cache's clock; 0.0: never


class _Pending:
    """Reads of one key in flight, and the last invalidation that spoilt them."""

    __slots__ = ("count", "spoilt_at")

    def __init__(self) -> None:
        self.count = 0
        self.spoilt_at = -1


def document_size(document: Any, key: bytes) -> int:
    """The bytes an entry holds: every bytes field of the document, its key, the overhead.

    Every field, not a fixed list: the ``Document`` may grow fields (compressed
    variants), and those cost memory too.
    """
    return _held(vars(document).values()) + len(key) + ENTRY_OVERHEAD


def _held(values: Iterable[Any]) -> int:
    """The bytes in ``values``, also inside tuples (a document's ``(coding, bytes)`` variants)."""
    held = 0
    for value in values:
        if isinstance(value, bytes):
            held += len(value)
        elif isinstance(value, tuple):
            held += _held(value)
    return held


class HotCache:
    """Documents by Redis key; see the module's rule. ``clock``: seconds, monotonic.

    ``memory_bytes`` bounds what the cache adds to the worker's memory; its
    entries hold at most ``max_bytes`` of it (``HEAP_GROWTH``).
    """

    def __init__(
        self, memory_bytes: int, clock: Callable[[], float] = time.monotonic, max_lag: Optional[float] = None
    ) -> None:
        self.max_bytes = int(memory_bytes / HEAP_GROWTH)
        self.max_entry = self.max_bytes // MAX_ENTRY_SHARE
        self._clock = clock
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._pending: Dict[bytes, _Pending] = {}
        # Until the first fill tells the entries' size: as if of 1 KiB.
        self._frequency = FrequencySketch(max(MIN_SAMPLE, SAMPLE_PER_ENTRY * (self.max_bytes >> 10)))
        self._live = False
        # None: no bound on the invalidations' lag (a cache without a heartbeat: tests, tools).
        self.max_lag = max_lag
        # Hits are served until this moment on the clock (``confirm``).
        self._fresh_until = _ALWAYS if max_lag is None else _NEVER
        # Called when a held entry is not served for want of a recent confirmation (the heartbeat wakes).
        self.on_lagging: Callable[[], None] = _nothing
        # Bumped by every invalidation and every loss; a ticket is this
        # number when its read was sent, and tickets below _floor are void.
        self._sequence = 0
        self._floor = 0
        # Counted here, read by the metrics once a second.
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidations = 0
        self.refused_fills = 0
        self.refused_admissions = 0
        self.lagging = 0

    def now(self) -> float:
        """The cache's clock (the heartbeat stamps its pings with it)."""
        return self._clock()

    @property
    def live(self) -> bool:
        """Whether the feed is up (entries are kept and served)."""
        return self._live

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Any:
        """The cached document, or None (counted as a miss)."""
        document = self.hit(key)
        if document is None:
            entry = self._entries.get(key)
            if entry is not None and entry.expires and self._clock() >= entry.expires:
                self._drop(key)  # held, but past its expiry
            self.misses += 1
        return document

    def hit(self, key: bytes) -> Any:
        """The cached document, counted as a hit; None when not held, and not counted then (``get`` counts the miss)."""
        # No live check: entries exist only while the feed is up.
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._clock()
        if now > self._fresh_until:  # the invalidations may lag more than max_lag: Redis answers
            self.lagging += 1
            self.on_lagging()
            return None
        if entry.expires and now >= entry.expires:
            return None
        self._entries.move_to_end(key)
        self._frequency.add(key)
        self.hits += 1
        return entry.document

    def reserve(self, key: bytes) -> Optional[int]:
        """A ticket for a read of ``key`` about to be sent, or None: the feed is
        down, or the key may not fill (read once lately, or, with the cache
        full, not more than one read more often than the entry it would push out).

        Every ticket must come back exactly once, by ``fill`` or ``release``.
        """
        if not self._live or not self._may_fill(key):
            return None
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending()
        pending.count += 1
        return self._sequence

    def _may_fill(self, key: bytes) -> bool:
        """Count this miss of ``key``; whether its read may fill (see ``cache.hot.admission``)."""
        reads = self._frequency.add(key)
        if reads < 2:
            return False
        entries = len(self._entries)
        if not entries or self.bytes + self.bytes // entries <= self.max_bytes:
            return True  # room for one more entry of the size they have
        # By more than one read: counts are estimates, and keys read as often
        # would swap places on their noise, for a fill and an eviction each
        # (a read of 200,000 documents in turn over 2 workers: evictions fell,
        # in a simulation of it and in the measured run,
        # docs/history/performance.md, "The miss path").
        if reads > self._frequency.count(next(iter(self._entries))) + 1:
            return True
        self.refused_admissions += 1
        return False

    def fill(self, key: bytes, ticket: int, document: Any, pttl: Any) -> None:
        """The reply of a read sent with ``ticket``: cached unless something may have changed since."""
        spoilt = self._settle(key) > ticket or ticket < self._floor
        if spoilt:
            self.refused_fills += 1
            return
        if document is None or pttl == _NO_KEY:
            return  # absence is not cached: a create is an invalidation too, but not worth the risk
        size = document_size(document, key)
        if size > self.max_entry:
            return
        expires = 0.0 if pttl == _NO_EXPIRY else self._clock() + int(pttl) / 1000.0
        if key in self._entries:
            self._drop(key)
        self._entries[key] = _Entry(document, size, expires)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.bytes -= oldest.size
            self.evictions += 1
        # "Lately": about ten reads per entry the cache holds, at the size it holds now.
        holds = self.max_bytes * len(self._entries) // self.bytes
        self._frequency.sample = max(MIN_SAMPLE, SAMPLE_PER_ENTRY * holds)

    def release(self, key: bytes, ticket: int) -> None:
        """A read sent with ``ticket`` failed: its ticket back, nothing cached."""
        self._settle(key)

    def invalidate(self, keys: Optional[Iterable[bytes]]) -> None:
        """Redis says these keys changed (None: every key, a flush)."""
        self._sequence += 1
        if keys is None:
            self.invalidations += 1
            self._forget_all()
            return
        for key in keys:
            self.invalidations += 1
            self._invalidate_one(key)

    def written(self, key: bytes) -> None:
        """This worker wrote ``key`` (or tried to): its entry goes before the write is answered."""
        self._sequence += 1
        self._invalidate_one(key)

    def confirm(self, sent_at: Optional[float]) -> None:
        """Every invalidation of a write Redis ran before ``sent_at`` (on the cache's clock) has arrived:
        hits are served until ``sent_at + max_lag``. None: nothing is confirmed (a tracker is new)."""
        if self.max_lag is not None:
            self._fresh_until = _NEVER if sent_at is None else sent_at + self.max_lag

    @property
    def fresh(self) -> bool:
        """Whether a hit would be served now (the invalidations are known to be at most ``max_lag`` behind)."""
        return self._live and self._clock() <= self._fresh_until

    def up(self) -> None:
        """The feed is up: entries may be made from reads sent from now on."""
        self._forget_all()
        self._live = True

    def down(self) -> None:
        """The feed is down (or not yet up): nothing is cached or served until ``up``."""
        self._live = False
        self._forget_all()
        if self.max_lag is not None:
            self._fresh_until = _NEVER

    def reset(self) -> None:
        """The topology changed (a slot moved, a master changed): start over."""
        self._forget_all()

    def void(self) -> None:
        """No read in flight may fill; what is cached stays."""
        self._sequence += 1
        self._floor = self._sequence

    def stats(self) -> Dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "invalidations": self.invalidations,
            "refused_fills": self.refused_fills,
            "refused_admissions": self.refused_admissions,
            "lagging": self.lagging,
            "bytes": self.bytes,
            "entries": len(self._entries),
            "bypassed": 0 if self._live else 1,
        }

    def _invalidate_one(self, key: bytes) -> None:
        if key in self._entries:
            self._drop(key)
        pending = self._pending.get(key)
        if pending is not None:
            pending.spoilt_at = self._sequence

    def _settle(self, key: bytes) -> int:
        """A ticket of ``key`` comes back; the sequence number of the invalidation that spoilt it, if any."""
        pending = self._pending.get(key)
        if pending is None:
            return -1
        pending.count -= 1
        if pending.count <= 0:
            del self._pending[key]
        return pending.spoilt_at

    def _drop(self, key: bytes) -> None:
        self.bytes -= self._entries.pop(key).size

    def _forget_all(self) -> None:
        self._sequence += 1
        self._floor = self._sequence
        self._entries.clear()
        self.bytes = 0
