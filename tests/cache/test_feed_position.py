"""cache.feed.position: a vector of stream ids as a short opaque token, refused when it is not one."""

from __future__ import annotations

import random

import pytest

from cache.feed.position import (
    START,
    ZERO,
    PositionError,
    advanced,
    ahead,
    decode,
    encode,
    format_id,
    parse_id,
)
from cache.keys import INDEX_SHARDS


def test_a_position_survives_its_token():
    rng = random.Random(5)
    for _ in range(200):
        base = rng.randint(1, 2**42)
        position = tuple(
            ZERO if rng.random() < 0.3 else (base + rng.randint(0, 10**7), rng.randint(0, 3)) for _ in range(16)
        )
        assert decode(b"orders", encode(b"orders", position)) == position


def test_tokens_are_url_safe_and_short_for_shards_written_within_a_minute():
    now = 1_790_000_000_000
    position = tuple((now + shard * 3_700, shard % 2) for shard in range(INDEX_SHARDS))
    token = encode(b"orders", position)
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert len(token) <= 100
    assert decode(b"orders", encode(b"orders", START)) == START


@pytest.mark.parametrize("token", ["", "!!!", "AAAA", "A" * 513, "AaXp", "AaXpn6rV9KA0AAAAAAAAAQAAAAAAAOEDAAAAAAAA"])
def test_garbage_is_refused(token):
    with pytest.raises(PositionError):
        decode(b"orders", token)


def test_a_position_of_another_collection_is_refused():
    token = encode(b"orders", START)
    with pytest.raises(PositionError, match="another collection"):
        decode(b"users", token)


def test_ids_and_comparisons():
    assert parse_id(b"1700000000000-3") == (1700000000000, 3)
    assert format_id((1700000000000, 3)) == b"1700000000000-3"
    moved = advanced(START, 4, (9, 1))
    assert moved[4] == (9, 1) and moved[:4] == START[:4]
    assert ahead(moved, START) == [4] and ahead(START, moved) == []
