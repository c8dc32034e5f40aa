"""A stored document and the values around it: conditions, pages, the write scripts' calls and replies.

What the store's reads and writes (``cache.documents.store``) and a batch
(``cache.batches.batch``) share: how a document is read (``read_command``,
``stored_document``), how a write is sent and its reply read
(``PreparedPut``/``put_outcome``, ``PreparedDelete``/``delete_outcome``),
and the HTTP dates a stored ``Last-Modified`` is written and compared in.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Sequence, Tuple

from cache import keys
from cache.documents import scripts
from cache.documents.variants import CODINGS, FIELDS
from cache.errors import DocumentNotFound, PreconditionFailed

_PUT_FAILED, _REPLACED, _CREATED = 0, 1, 2
# A write's outcome: whether it created the document; None when this very
# write (its ETag) had been applied before (cache.documents.scripts.PUT).
Created = Optional[bool]
_DELETE_FAILED, _DELETE_MISSING = 0, -1


@dataclass(frozen=True)
class Document:
    """A stored document: its bytes, the validators and the compressed variants stored with them."""

    body: bytes
    etag: bytes
    last_modified: bytes
    # (content coding, encoded bytes) for each variant stored (cache.documents.variants).
    encoded: Tuple[Tuple[str, bytes], ...] = ()
    # What the collection's owner rule found in the body, kept by ``handlers.ownership.owner_of``: a document's
    # bytes never change, so a hot read under the rule parses them once per version, not on every read.
    owner_found: Any = field(default=None, init=False, repr=False, compare=False)

    def variant(self, coding: str) -> Optional[bytes]:
        """The bytes of ``coding``'s variant, or None if none is stored."""
        for name, data in self.encoded:
            if name == coding:
                return data
        return None


@dataclass(frozen=True)
class Conditions:
    """Pre-parsed ``If-Match`` / ``If-None-Match`` (``b''``, ``b'*'`` or tags) and ``If-Unmodified-Since``.

    ``unmodified_since`` (seconds since the epoch) counts only without
    ``if_match`` (RFC 9110 13.2.2) and only for a document that exists.
    """

    if_match: bytes = b""
    if_none_match: bytes = b""
    unmodified_since: Optional[int] = None


@dataclass(frozen=True)
class Page:
    """One page of a collection, and the id to continue after (or None)."""

    bodies: List[bytes]
    last_id: Optional[bytes]
    ids: List[bytes] = field(default_factory=list)  # each body's id (the NDJSON export's with_ids)


NO_CONDITIONS = Conditions()


@dataclass(frozen=True)
class PreparedPut:
    """A create-or-replace ready to send: the document it stores and ``scripts.PUT``'s keys and arguments."""

    document: Document
    keys: List[bytes]
    args: List[Any]

    def command(self) -> Tuple[Any, ...]:
        return scripts.PUT.call(self.keys, self.args)


@dataclass(frozen=True)
class PreparedDelete:
    """A delete ready to send: ``scripts.DELETE``'s keys and arguments."""

    keys: List[bytes]
    args: List[Any]

    def command(self) -> Tuple[Any, ...]:
        return scripts.DELETE.call(self.keys, self.args)


def put_outcome(write: PreparedPut, result: Any) -> Tuple[Document, Created]:
    """What ``scripts.PUT`` answered: the document stored and whether it was created; or ``PreconditionFailed``."""
    if isinstance(result, list):
        # Applied before, by an earlier attempt at this very write: as it was then.
        return replace(write.document, last_modified=result[1]), None
    if result == _PUT_FAILED:
        raise PreconditionFailed()
    return write.document, result == _CREATED


def delete_outcome(result: Any) -> None:
    """What ``scripts.DELETE`` answered: nothing, or ``PreconditionFailed`` / ``DocumentNotFound``."""
    if result == _DELETE_FAILED:
        raise PreconditionFailed()
    if result == _DELETE_MISSING:
        raise DocumentNotFound()


# Every variant field, in the order of the content codings (cache.documents.variants).
VARIANT_FIELDS = tuple(FIELDS.values())


def read_command(collection: bytes, doc_id: bytes) -> Tuple[bytes, ...]:
    """The document's read (``stored_document`` reads its reply)."""
    return read_key(keys.document_key(collection, doc_id))


def read_key(key: bytes) -> Tuple[bytes, ...]:
    # Every variant comes along: one round trip whatever the client accepts,
    # and a whole document for whoever keeps it (the hot cache too).
    return (b"HMGET", key, b"b", b"e", b"m", *VARIANT_FIELDS)


def filling_read(key: bytes) -> List[Tuple[bytes, ...]]:
    """The read, and the key's expiry for the hot cache's entry (see ``cache.hot.cache``)."""
    return [read_key(key), (b"PTTL", key)]


def stored_document(fields: Sequence[Optional[bytes]]) -> Optional[Document]:
    body, etag, modified = fields[0], fields[1], fields[2]
    if body is None:
        return None
    if fields[3] is None and len(fields) == 4:
        return Document(body, etag, modified)  # the common case: one coding, not stored
    encoded = tuple((coding, data) for coding, data in zip(CODINGS, fields[3:]) if data is not None)
    return Document(body, etag, modified, encoded)


def tag_matches(header: bytes, etag: bytes) -> bool:
    return header == b"*" or etag in header.split()


def http_date(second: int) -> bytes:
    return email.utils.formatdate(second, usegmt=True).encode()


def epoch_of(http_date: bytes) -> int:
    """A stored ``Last-Modified`` (always IMF-fixdate, made by ``http_date``) in seconds."""
    return int(email.utils.mktime_tz(email.utils.parsedate_tz(http_date.decode("ascii"))))
