"""Failures of the store, as types the HTTP layer maps to statuses."""

from __future__ import annotations


class StoreError(Exception):
    """Base of everything the store raises on purpose."""


class RedisUnavailable(StoreError):
    """No connection to Redis could be had in time (maps to 503)."""


class RedisTimeout(StoreError):
    """Redis took a command but did not answer in time (maps to 504)."""


class RedisReplyError(StoreError):
    """Redis answered with an error reply (maps to 502)."""


class PreconditionFailed(StoreError):
    """An ``If-Match`` / ``If-None-Match`` condition did not hold."""


class DocumentNotFound(StoreError):
    """The document does not exist."""


class WriteConflict(StoreError):
    """A merge patch lost the race against other writers too many times."""


class DocumentTooLarge(StoreError):
    """A merge patch would make the document larger than allowed."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the merged document would be {size} bytes")
        self.size = size
