"""Positions in a collection's change feed: one stream id per shard, as an opaque token.

A collection's changes are kept in ``INDEX_SHARDS`` streams, one per shard
(``cache.feed.streams`` says why), so "how far a client has read" is a
vector: for each shard, the id of the last event delivered from it (``0-0``
for none). A vector is exact whatever order events of different shards were
delivered in: resuming from it skips every event delivered and none other.
A single stream id could not say that: the shards' ids come from different
clocks (cluster nodes), and a shard read later may hold an older id.

Clients see the vector as one opaque token (the SSE ``id:``, a long poll's
``next``): base64url of a version byte, two bytes of the collection's
CRC-32 (a token of another collection is refused, not misread), the
smallest millisecond in the vector as a varint, then for each shard
``0`` for ``0-0`` or the milliseconds above that base plus one, and the
sequence, as varints. Shards written within a minute of each other cost
about four bytes each: ~100 characters in all.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import List, Sequence, Tuple

from cache.keys import INDEX_SHARDS

# (milliseconds, sequence): a Redis stream id, compared as a tuple.
StreamId = Tuple[int, int]
Position = Tuple[StreamId, ...]
ZERO: StreamId = (0, 0)
START: Position = (ZERO,) * INDEX_SHARDS
_VERSION = 1
# A token longer than this cannot be one of ours (16 shards of 2 varints of at most 10 bytes).
MAX_TOKEN_CHARS = 512


class PositionError(ValueError):
    """A token that is not a position this server made for this collection."""


def parse_id(text: bytes) -> StreamId:
    """``b"1700000000000-3"`` as ``(1700000000000, 3)``."""
    ms, _, seq = text.partition(b"-")
    return int(ms), int(seq or 0)


def format_id(stream_id: StreamId) -> bytes:
    return b"%d-%d" % stream_id


def advanced(position: Position, shard: int, stream_id: StreamId) -> Position:
    """``position`` with ``shard`` moved to ``stream_id``."""
    return position[:shard] + (stream_id,) + position[shard + 1 :]


def encode(collection: bytes, position: Position) -> str:
    """The opaque token of ``position`` in ``collection``'s feed."""
    out = bytearray((_VERSION,))
    out += (zlib.crc32(collection) & 0xFFFF).to_bytes(2, "big")
    used = [ms for ms, seq in position if (ms, seq) != ZERO]
    base = min(used) if used else 0
    _varint(out, base)
    for stream_id in position:
        if stream_id == ZERO:
            out.append(0)
        else:
            _varint(out, stream_id[0] - base + 1)
            _varint(out, stream_id[1])
    return base64.urlsafe_b64encode(bytes(out)).rstrip(b"=").decode("ascii")


def decode(collection: bytes, token: str) -> Position:
    """The position a token names; ``PositionError`` if it is not one of ``collection``'s."""
    if len(token) > MAX_TOKEN_CHARS:
        raise PositionError("too long")
    try:
        data = base64.urlsafe_b64decode(token.encode("ascii") + b"=" * (-len(token) % 4))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise PositionError("not base64url") from None
    if len(data) < 4 or data[0] != _VERSION:
        raise PositionError("not a position")
    if int.from_bytes(data[1:3], "big") != zlib.crc32(collection) & 0xFFFF:
        raise PositionError("a position in another collection's feed")
    base, at = _read_varint(data, 3)
    ids: List[StreamId] = []
    for _ in range(INDEX_SHARDS):
        delta, at = _read_varint(data, at)
        if delta == 0:
            ids.append(ZERO)
            continue
        seq, at = _read_varint(data, at)
        ids.append((base + delta - 1, seq))
    if at != len(data):
        raise PositionError("trailing bytes")
    return tuple(ids)


def ahead(position: Position, other: Sequence[StreamId]) -> List[int]:
    """The shards where ``position`` is past ``other``."""
    return [shard for shard, stream_id in enumerate(position) if stream_id > other[shard]]


def _varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: bytes, at: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise PositionError("truncated")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
