"""Compressed variants of a document, made once when it is written.

A document of at least ``min_bytes`` is stored with its compressed
encodings beside its bytes, in fields of its hash (``cache.keys``), so a
read that accepts one sends it verbatim: nothing is compressed per read.
An encoding that saves less than ``MIN_SAVING`` is not stored; a write
that stores none removes those an earlier, larger version had.

Each variant has an entity tag of its own (RFC 9110 8.8.3: a strong tag
names one representation): the document's tag with ``-<coding>`` inside
the quotes. ``base_tag`` undoes that, so an ``If-None-Match`` carrying any
variant's tag is recognised.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# Content coding -> hash field, in the server's order of preference
# (smallest first) when a client accepts several equally.
FIELDS: Dict[str, bytes] = {"gzip": b"g"}
CODINGS: Tuple[str, ...] = tuple(FIELDS)
# A variant must be at most this share of the body to be worth storing.
MIN_SAVING = 0.9
# zlib level 1: a 10 KB document's gzip is within a few percent of level 6's
# size at a fraction of the cost (docs/api.md, "HTTP caching and compression").
GZIP_LEVEL = 1
_GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream


@dataclass(frozen=True)
class Variants:
    """How a store makes variants: the smallest body worth compressing (0: never)."""

    min_bytes: int = 1024

    def encode(self, body: bytes) -> Tuple[Tuple[str, bytes], ...]:
        """``(content coding, encoded bytes)`` for each variant worth storing for ``body``."""
        if not self.min_bytes or len(body) < self.min_bytes:
            return ()
        encoded = gzip_of(body)
        if len(encoded) > len(body) * MIN_SAVING:
            return ()
        return (("gzip", encoded),)


def gzip_of(body: bytes) -> bytes:
    """``body`` gzipped (also what list pages are compressed with as they are sent)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    return compressor.compress(body) + compressor.flush()


NO_VARIANTS = Variants(0)
DEFAULT_VARIANTS = Variants()


def variant_tag(etag: bytes, coding: str) -> bytes:
    """The entity tag of ``coding``'s variant of a document tagged ``etag``."""
    return etag[:-1] + b"-" + coding.encode("ascii") + b'"'


def base_tag(tag: bytes) -> bytes:
    """The document's own tag, from its tag or any of its variants' tags."""
    for coding in CODINGS:
        suffix = b"-" + coding.encode("ascii") + b'"'
        if tag.endswith(suffix):
            return tag[: -len(suffix)] + b'"'
    return tag


def decoded(coding: Optional[str], data: bytes) -> bytes:
    """``data`` with ``coding`` undone (for tests and tools, never the read path)."""
    if coding is None:
        return data
    if coding == "gzip":
        return zlib.decompress(data, _GZIP_WBITS)
    raise ValueError(f"unknown coding {coding!r}")
