"""Failures of the store, as types the HTTP layer maps to statuses."""

from __future__ import annotations

from typing import Optional


class StoreError(Exception):
    """Base of everything the store raises on purpose."""


class RedisUnavailable(StoreError):
    """No connection to Redis could be had in time (maps to 503)."""


class RedisTimeout(StoreError):
    """Redis took a command but did not answer in time (maps to 504)."""


class RedisReplyError(StoreError):
    """Redis answered with an error reply (maps to 502 unless a subclass says better)."""

    @property
    def error_class(self) -> str:
        """The reply's first word (``WRONGTYPE``, ``ERR``, ``OOM``...): what the log names."""
        words = str(self).split(None, 1)
        return words[0] if words else "ERR"


class RedisOutOfMemory(RedisReplyError):
    """``OOM``: Redis is at ``maxmemory`` and refuses writes (maps to 507)."""


class RedisNotReady(RedisReplyError):
    """A state Redis leaves by itself: a replica (``READONLY``), a master down,
    loading, a busy script, a cluster slot in flux (maps to 503 with ``Retry-After``)."""


# Error classes that a retry in a moment may find gone: a failover promotes
# a replica, a load finishes, a script is killed, a slot settles.
_NOT_READY = frozenset(("READONLY", "MASTERDOWN", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN"))


def reply_error(message: str) -> RedisReplyError:
    """The store's error for a Redis error reply, chosen by its class."""
    error_class = message.split(None, 1)[0] if message.strip() else ""
    if error_class == "OOM":
        return RedisOutOfMemory(message)
    if error_class in _NOT_READY:
        return RedisNotReady(message)
    return RedisReplyError(message)


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
