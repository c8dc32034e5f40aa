"""Failures of the store, as types the HTTP layer maps to statuses.

The driver's (no connection, no reply, an error reply) come from
``cache.redis.errors`` and are named here too, so that the HTTP layer
finds every error it maps in one module.
"""

from __future__ import annotations

from typing import Optional

from cache.redis.errors import (
    DocumentNotIndexable,
    RedisNotReady,
    RedisOutOfMemory,
    RedisReplyError,
    RedisTimeout,
    RedisUnavailable,
    StoreError,
)

__all__ = [
    "DocumentNotFound",
    "DocumentNotIndexable",
    "DocumentTooLarge",
    "NotReplicated",
    "PreconditionFailed",
    "RedisNotReady",
    "RedisOutOfMemory",
    "RedisReplyError",
    "RedisTimeout",
    "RedisUnavailable",
    "StoreError",
    "WriteConflict",
]


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


class NotReplicated(StoreError):
    """A write the primary applied but fewer replicas than the write concern confirmed in time (maps to 503).

    The write is not undone (Redis cannot), so the error carries what the
    client needs to check and retry safely: the new ETag (None for a delete).
    """

    def __init__(self, confirmed: int, wanted: int, timeout: float, etag: Optional[bytes]) -> None:
        super().__init__(
            f"the write was applied on the primary but confirmed by {confirmed} of {wanted} replicas"
            f" within {timeout:g} s; it is lost if the primary fails before they have it"
        )
        self.etag = etag
        self.doc_id: Optional[bytes] = None  # set for a create, whose id the client has not seen
