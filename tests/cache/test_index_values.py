"""Index entries sort as their values do: ``cache.indexes.values`` held to Python's own order over generated values.

A query over a declared index will be a ``ZRANGEBYLEX`` over these bytes,
so an entry that sorts in the wrong place is a document a range query
misses or returns wrongly. The properties: two numbers' encodings compare
as the numbers do (and equal numbers, ``1`` and ``1.0``, ``0`` and ``-0``,
share one); two strings' as their code points do; a composite entry (values
then id) as the tuple does, which needs no value's encoding to be a prefix
of another's.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.indexes.values import (
    BOOLEAN,
    EXACT_INTEGERS,
    MAX_STRING_BYTES,
    MISSING,
    NUMBER,
    STRING,
    encode,
    entry,
    member,
    pointer_tokens,
    prefix_end,
)

numbers = st.one_of(
    st.floats(min_value=-(2.0**53), max_value=2.0**53, exclude_min=True, exclude_max=True),
    st.integers(min_value=-EXACT_INTEGERS + 1, max_value=EXACT_INTEGERS - 1),
)
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=8).map(str.encode)


def decode_number(encoded: bytes) -> float:
    """The number ``encode(value, NUMBER)`` made ``encoded`` from."""
    (bits,) = struct.unpack(">Q", encoded)
    bits = bits & 0x7FFFFFFFFFFFFFFF if bits >> 63 else bits ^ 0xFFFFFFFFFFFFFFFF
    return struct.unpack(">d", struct.pack(">Q", bits))[0]


def _sign(a: object, b: object) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


@settings(max_examples=2000)
@given(numbers, numbers)
@pytest.mark.slow
def test_numbers_sort_as_numbers(a: float, b: float) -> None:
    assert _sign(encode(a, NUMBER), encode(b, NUMBER)) == _sign(a, b)


@given(numbers)
def test_a_number_comes_back(value: float) -> None:
    encoded = encode(value, NUMBER)
    assert encoded is not None and len(encoded) == 8
    assert decode_number(encoded) == value


@settings(max_examples=2000)
@given(texts, texts)
def test_strings_sort_by_code_point(a: str, b: str) -> None:
    assert _sign(encode(a, STRING), encode(b, STRING)) == _sign(a, b)


@settings(max_examples=2000)
@given(st.tuples(texts, numbers, ids), st.tuples(texts, numbers, ids))
@pytest.mark.slow
def test_composite_entries_sort_as_tuples(a: tuple, b: tuple) -> None:
    fields = [(("s",), STRING), (("n",), NUMBER)]
    first = entry({"s": a[0], "n": a[1]}, fields, a[2])
    second = entry({"s": b[0], "n": b[1]}, fields, b[2])
    # Equal numbers (1 and 1.0) are one value; ids compare as bytes.
    assert _sign(first, second) == _sign((a[0], float(a[1]), a[2]), (b[0], float(b[1]), b[2]))


@given(texts, ids, numbers)
def test_a_prefix_range_holds_exactly_its_value(value: str, doc_id: bytes, after: float) -> None:
    """``[prefix`` to ``(prefix_end(prefix)``: every entry of the value, whatever follows it, and no other value's."""
    prefix = encode(value, STRING)
    assert prefix is not None
    end = prefix_end(prefix)
    assert end is not None
    for own in (prefix + doc_id, prefix + encode(after, NUMBER) + doc_id):  # type: ignore[operator]
        assert prefix <= own < end
    longer = encode(value + "a", STRING) + doc_id  # type: ignore[operator]
    nul = encode(value + "\x00", STRING) + doc_id  # type: ignore[operator]
    assert not prefix <= longer < end
    assert not prefix <= nul < end


def test_prefix_end() -> None:
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") is None
    top = encode(2.0**52, NUMBER)
    assert top is not None and top[0] == 0xC3
    assert b"k" + top + b"id" < prefix_end(b"k")  # type: ignore[operator]


def test_equal_numbers_share_an_entry() -> None:
    assert encode(1, NUMBER) == encode(1.0, NUMBER)
    assert encode(0, NUMBER) == encode(-0.0, NUMBER) == encode(0.0, NUMBER)
    assert encode(-1.5, NUMBER) < encode(-0.0, NUMBER) < encode(5e-324, NUMBER) < encode(1e15, NUMBER)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, NUMBER),  # a boolean is not a number here, though Python's bool is an int
        ("1", NUMBER),
        (None, STRING),
        (1, STRING),
        ({"a": 1}, STRING),
        ([1], NUMBER),
        (1, BOOLEAN),
        (EXACT_INTEGERS + 1, NUMBER),  # a double cannot tell it from 2**53: an equality query would
        (EXACT_INTEGERS, NUMBER),  # nor 2**53 from it, once parsed
        (-EXACT_INTEGERS, NUMBER),
        (1e300, NUMBER),
        (math.inf, NUMBER),
        (math.nan, NUMBER),
        (MISSING, STRING),
        ("x" * (MAX_STRING_BYTES + 1), STRING),  # an entry comes back with every query that meets it
        ("é" * (MAX_STRING_BYTES // 2 + 1), STRING),  # bytes, not characters
    ],
)
def test_values_of_another_type_have_no_entry(value: object, kind: str) -> None:
    assert encode(value, kind) is None


def test_booleans() -> None:
    assert encode(False, BOOLEAN) < encode(True, BOOLEAN)  # type: ignore[operator]


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="string, number, boolean"):
        encode("a", "date")


@pytest.mark.parametrize(
    ("pointer", "tokens"),
    [("/a", ("a",)), ("/a/b", ("a", "b")), ("/a~1b", ("a/b",)), ("/m~0n", ("m~n",)), ("/~01", ("~1",)), ("/", ("",))],
)
def test_pointer_tokens(pointer: str, tokens: tuple) -> None:
    assert pointer_tokens(pointer) == tokens


@pytest.mark.parametrize("pointer", ["", "a", "/a~2", "/a~"])
def test_bad_pointers(pointer: str) -> None:
    with pytest.raises(ValueError):
        pointer_tokens(pointer)


def test_member_follows_rfc_6901() -> None:
    document = {"a": {"b": [10, {"c": "x"}]}, "": 1, "k/l": 2}
    assert member(document, ("a", "b", "0")) == 10
    assert member(document, ("a", "b", "1", "c")) == "x"
    assert member(document, ("",)) == 1
    assert member(document, pointer_tokens("/k~1l")) == 2
    for missing in [("a", "b", "2"), ("a", "b", "01"), ("a", "b", "-"), ("a", "x"), ("a", "b", "0", "c"), ("z",)]:
        assert member(document, missing) is MISSING
