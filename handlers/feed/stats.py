"""A worker's change-feed counters, apart from the feed's code: the master's metrics read them without loading it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FeedStats:
    """This worker's feed counters, read by the metrics flush (``api.observe``)."""

    subscribers: int = 0
    events_sent: int = 0
    fell_behind: int = 0
    lost: int = 0
