"""Failures of Redis as the links report them: no connection, no reply, an error reply.

``StoreError`` is their base and that of the stores' own errors
(``cache.errors``, where the HTTP layer finds them all).
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of everything the driver and the stores built on it raise on purpose."""


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


class DocumentNotIndexable(RedisReplyError):
    """``UNINDEXABLE``: a write's script could not read the document for its collection's indexes
    (``cache.indexes.scripts``; maps to 422). Nothing was written."""

    def __str__(self) -> str:
        return super().__str__().split(None, 1)[-1]


# Error classes that a retry in a moment may find gone: a failover promotes
# a replica, a load finishes, a script is killed, a slot settles.
_NOT_READY = frozenset(("READONLY", "MASTERDOWN", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN"))


def reply_error(message: str) -> RedisReplyError:
    """The error for a Redis error reply, chosen by its class."""
    error_class = message.split(None, 1)[0] if message.strip() else ""
    if error_class == "OOM":
        return RedisOutOfMemory(message)
    if error_class == "UNINDEXABLE":
        return DocumentNotIndexable(message)
    if error_class in _NOT_READY:
        return RedisNotReady(message)
    return RedisReplyError(message)
