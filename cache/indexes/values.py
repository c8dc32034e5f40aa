"""A document's values for a declared index, as bytes that sort as the values do.

A declared index (issue #47) lists a collection's documents by one or more
members, each named by a JSON Pointer (RFC 6901) and typed: ``string``,
``number`` or ``boolean``. Its entries live in a sorted set whose members
all have score 0, so Redis orders them by their bytes (``ZRANGEBYLEX``):
an entry is the encoding of each of its values, in the index's order, then
the document's id. For that byte order to be the values' order:

- a number is its IEEE 754 double, big-endian, with the sign bit flipped
  (all bits, for a negative one): the bytes of -1.5 < -0 = 0 < 2 < 1e300
  sort as the numbers do; -0 is stored as 0, and a number of magnitude
  2**53 or more is not indexed: past it a double does not hold every
  integer, so two integers would share an entry and an equality query
  could answer the other one (and Redis's Lua, which computes a write's
  entries, sees numbers only as doubles);
- a string (of up to ``MAX_STRING_BYTES``) is its UTF-8 bytes (whose byte
  order is the code points' order), each 0x00 byte written 0x00 0xFF and the end marked 0x00 0x00, so
  that "a" sorts before "a\\u0000" and "ab", and a value is never a prefix
  of another's encoding;
- a boolean is one byte, 0x00 for false and 0x01 for true.

A document whose member is missing, or of another type than the index's
(a number where a string is declared, an object, null, a number past
2**53, a string longer than ``MAX_STRING_BYTES``), has no entry in that index: it is simply not found by its queries.

An array field (``string[]``, ``number[]``) makes an index multi-entry: the
document has one entry per distinct element of the array (an element of
another type, or past the bounds above, has none), each with the other
fields' values and the id. The document's hash keeps them all in the
index's one field (``pack_entries``: each entry after its length, two bytes
big-endian, in the array's order, each once), so a write compares the field
as a whole and, when it changed, adds and removes only the entries that
differ. An array of more than ``MAX_ARRAY_ENTRIES`` elements is refused
(``cache.indexes.scripts``). Such an index's version starts with
``MULTI_VERSION`` (``cache.indexes.declared``): every script and the live
queries tell its field's layout by its name.

The same encoding is written twice: here, for a query's bounds, and in
Lua (``cache.indexes.scripts``), for a write's entries, which Redis computes
from the stored bytes in the write's own script. ``tests/cache/test_index_scripts.py``
holds the two to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Sequence, Tuple

STRING, NUMBER, BOOLEAN = "string", "number", "boolean"
STRING_ARRAY, NUMBER_ARRAY = "string[]", "number[]"
TYPES = (STRING, NUMBER, BOOLEAN, STRING_ARRAY, NUMBER_ARRAY)
# The most elements an array field of a document may hold: each is an entry, written and removed in the write's
# own script, and all of them are in the document's hash and in its change-feed event.
MAX_ARRAY_ENTRIES = 64
# The first character of a multi-entry index's version (never a hex digit): how a field's layout is told by its name.
MULTI_VERSION = "m"
# Numbers indexed are of magnitude below this: from it on, a double does not hold every integer.
EXACT_INTEGERS = 2**53
# Strings indexed are of this many UTF-8 bytes at most: an entry is read back whole by every query that
# meets it, so a longer value (a document may hold a MiB in one member) is not indexed, as a value of
# another type is not.
MAX_STRING_BYTES = 512

# What ends a string's encoding: a string's entries that start with a text's encoding without it are those of the
# strings that start with that text (a prefix query, ``like``), since every 0x00 of the text is followed by 0xFF.
STRING_END = b"\x00\x00"

# A member a document does not have.
MISSING = object()


def pointer_tokens(pointer: str) -> Tuple[str, ...]:
    """The reference tokens of a JSON Pointer (``/a/b~1c`` is ``a``, ``b/c``); ValueError if it is not one.

    The empty pointer (the whole document) is refused: an index is of a member.
    """
    if not pointer.startswith("/"):
        raise ValueError(f"{pointer!r} is not a JSON Pointer to a member: it must start with /")
    tokens = []
    for token in pointer[1:].split("/"):
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise ValueError(f"{pointer!r}: ~ must be followed by 0 or 1 (RFC 6901)")
        tokens.append(token.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def member(document: Any, tokens: Sequence[str]) -> Any:
    """The value at ``tokens`` in ``document`` (parsed JSON), or ``MISSING``.

    Arrays are stepped into by decimal index, as RFC 6901 says (``0``, ``12``;
    not ``01`` nor ``-``).
    """
    value = document
    for token in tokens:
        if isinstance(value, dict):
            value = value.get(token, MISSING)
        elif isinstance(value, list) and token.isdigit() and token.isascii() and (token == "0" or token[0] != "0"):
            index = int(token)
            value = value[index] if index < len(value) else MISSING
        else:
            return MISSING
        if value is MISSING:
            return MISSING
    return value


def encode(value: Any, kind: str) -> Optional[bytes]:
    """``value``'s bytes in an index of ``kind``, or None when it has no entry there (another type, or inexact)."""
    if kind == STRING:
        if not isinstance(value, str):
            return None
        text = value.encode("utf-8", "surrogatepass")
        if len(text) > MAX_STRING_BYTES:
            return None
        return text.replace(b"\x00", b"\x00\xff") + STRING_END
    if kind == BOOLEAN:
        if not isinstance(value, bool):
            return None
        return b"\x01" if value else b"\x00"
    if kind == NUMBER:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if isinstance(value, int) and not -EXACT_INTEGERS < value < EXACT_INTEGERS:
            return None  # before float(): a huge integer would not even convert
        number = float(value)
        if not -EXACT_INTEGERS < number < EXACT_INTEGERS:
            return None  # and inf; NaN fails the comparison too
        if number == 0:
            number = 0.0  # -0 and 0 are one value
        (bits,) = struct.unpack(">Q", struct.pack(">d", number))
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | 0x8000000000000000
        return struct.pack(">Q", bits)
    raise ValueError(f"an index's type is one of {', '.join(TYPES)}, not {kind!r}")


class TooManyElements(ValueError):
    """A document's array field holds more than ``MAX_ARRAY_ENTRIES`` elements."""


def entry(document: Any, fields: Sequence[Tuple[Tuple[str, ...], str]], doc_id: bytes) -> Optional[bytes]:
    """The document's entry in an index of ``fields`` (each a pointer's tokens and a type), or None: not in it.

    For an index with an array field: its entries, packed (``pack_entries``);
    ``TooManyElements`` when the array is over ``MAX_ARRAY_ENTRIES``.
    """
    parts = []
    elements = None
    for tokens, kind in fields:
        value = member(document, tokens)
        if kind.endswith("[]"):
            if not isinstance(value, list):
                return None
            if len(value) > MAX_ARRAY_ENTRIES:
                raise TooManyElements(value)
            elements = (len(parts), [encode(element, kind[:-2]) for element in value])
            parts.append(b"")
            continue
        encoded = encode(value, kind)
        if encoded is None:
            return None
        parts.append(encoded)
    parts.append(doc_id)
    if elements is None:
        return b"".join(parts)
    at, encoded_elements = elements
    before, after = b"".join(parts[:at]), b"".join(parts[at + 1 :])
    entries = dict.fromkeys(before + one + after for one in encoded_elements if one is not None)
    return pack_entries(list(entries)) if entries else None


def pack_entries(entries: Sequence[bytes]) -> bytes:
    """A multi-entry index's field: each entry after its length (two bytes, big-endian)."""
    return b"".join(struct.pack(">H", len(one)) + one for one in entries)


def unpack_entries(packed: bytes) -> List[bytes]:
    """The entries of a multi-entry index's field (``pack_entries``)."""
    entries, at = [], 0
    while at + 2 <= len(packed):
        (length,) = struct.unpack_from(">H", packed, at)
        entries.append(bytes(packed[at + 2 : at + 2 + length]))
        at += 2 + length
    return entries


def is_multi(field: bytes) -> bool:
    """Whether an index's field (``x:<name>:<version>``, or an event's mark) is a multi-entry index's."""
    return field[-12:-11] == MULTI_VERSION.encode()


def prefix_end(prefix: bytes) -> Optional[bytes]:
    """The smallest bytes above every string that starts with ``prefix`` (None: no such bytes, all 0xFF).

    An exclusive upper bound, ``(`` + this, for "every entry that starts
    with the prefix": entries go on after a value with bytes of any value
    (a number's first byte may be 0xFF), so no fixed suffix would do.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def id_of(entry: bytes, kinds: str) -> bytes:
    """The id at the end of an entry of an index whose fields' type letters are ``kinds`` (``Index.kinds``)."""
    at = 0
    for kind in kinds:
        if kind == "s":
            at = entry.index(b"\x00\x00", at) + 2
        else:
            at += 8 if kind == "n" else 1
    return entry[at:]
