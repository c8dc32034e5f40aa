"""Where a member's value lies in a JSON text the strict reader has passed: its exact bytes, not re-encoded.

A batch's body (``{"operations": [{..., "document": {...}}, ...]}``) holds
each document's own bytes, and a batch's put stores them as a single PUT
stores its body: verbatim. Re-encoding the parsed value instead was a
large share of a batch of puts (vmprof,
``loadtest/studies/_batch_pace.py --profile``; docs/history/performance.md,
"Batches at Redis's pace").

The text must have passed ``cache.json.codec.loads`` first: it is RFC 8259 and
I-JSON, so this walk only finds where values begin and end, and the part
of a valid text that is one of its values is a valid text holding that
value (no repeated name, no lone surrogate, no number out of range, in the
part as in the whole). The walk is over bytes: every byte of JSON's
structure is ASCII and no byte of a UTF-8 multi-byte character is, so a
span found in the bytes is the value's own bytes.

Cost: a container is skipped by a walk of its bytes outside strings,
counting brackets, and each string by ``bytes.index`` of its closing
quote. On PyPy the walk is a loop the JIT compiles (cheaper than a regular
expression per bracket and string, or one bounded-repeat expression per
container; docs/history/performance.md, "Batches at Redis's pace"); on
CPython, where such a loop is interpreted byte by byte, a search for the
next bracket or quote does the walking. No state but a position and a depth: memory is
constant, time linear in the bytes.
"""

from __future__ import annotations

import json
import platform
import re
from typing import Iterator, Optional, Tuple

Span = Tuple[int, int]

_OPEN_OBJECT, _OPEN_ARRAY, _QUOTE, _BACKSLASH, _COMMA = b'{["\\,'
_OPENERS, _CLOSERS = (_OPEN_OBJECT, _OPEN_ARRAY), b"}]"
_SPACE = b" \t\n\r"
_ATOM_ENDS = b" \t\n\r,}]"
_STRUCTURE = re.compile(rb'[{}\[\]"]')


def element_member_spans(text: bytes, array: str, name: str) -> Iterator[Optional[Span]]:
    """For each element of the top-level object's member ``array``, in order: where its member ``name``'s value lies.

    None for an element that is no object or has no such member. Lazy: each
    element is walked when its span is asked for (a large body in slices).
    """
    position = _skip_space(text, 0)
    if text[position] != _OPEN_OBJECT:
        return
    wanted, expected = array.encode(), name.encode()
    position = _skip_space(text, position + 1)
    if text[position] in _CLOSERS:
        return
    while True:
        named, start = _member(text, position, wanted)
        if named and text[start] == _OPEN_ARRAY:
            end = yield from _elements(text, start, expected)
        else:
            end = _skip_value(text, start)
        position = _skip_space(text, end)
        if text[position] != _COMMA:
            return
        position = _skip_space(text, position + 1)


def _elements(text: bytes, position: int, name: bytes) -> Iterator[Optional[Span]]:
    """The spans of the elements of the array at ``position``; returns where the array ends."""
    position = _skip_space(text, position + 1)
    if text[position] in _CLOSERS:
        return position + 1
    while True:
        if text[position] == _OPEN_OBJECT:
            span, end = _object_member(text, position, name)
        else:
            span, end = None, _skip_value(text, position)
        yield span
        position = _skip_space(text, end)
        if text[position] != _COMMA:
            return position + 1
        position = _skip_space(text, position + 1)


def _object_member(text: bytes, position: int, name: bytes) -> Tuple[Optional[Span], int]:
    """The span of member ``name`` of the object at ``position`` (None: it has none), and where the object ends."""
    position = _skip_space(text, position + 1)
    if text[position] in _CLOSERS:
        return None, position + 1
    span: Optional[Span] = None
    while True:
        named, start = _member(text, position, name)
        end = _skip_value(text, start)
        if named:
            span = (start, end)
        position = _skip_space(text, end)
        if text[position] != _COMMA:
            return span, position + 1
        position = _skip_space(text, position + 1)


def _member(text: bytes, position: int, name: bytes) -> Tuple[bool, int]:
    """At a member's name: whether it is ``name``, and where its value begins."""
    end = _string_end(text, position)
    if end - position == len(name) + 2:
        named = text.startswith(name, position + 1)
    else:  # another name, or this one with escapes: compared as what it means
        named = text.find(b"\\", position, end) >= 0 and json.loads(text[position:end]) == name.decode()
    colon = _skip_space(text, end)
    assert text[colon] == ord(":"), "the text was not passed by the strict reader"
    return named, _skip_space(text, colon + 1)


def _skip_value(text: bytes, position: int) -> int:
    """Past the value that begins at ``position``."""
    first = text[position]
    if first in _OPENERS:
        return _skip_container(text, position)
    if first == _QUOTE:
        return _string_end(text, position)
    while text[position] not in _ATOM_ENDS:  # a number, true, false or null
        position += 1
    return position


def _walk_bytes(text: bytes, position: int) -> int:
    """Past the object or array that opens at ``position``: a loop over its bytes, strings stepped over."""
    depth = 0
    while True:
        char = text[position]
        if char == _QUOTE:
            position = _string_end(text, position)
            continue
        if char in _OPENERS:
            depth += 1
        elif char in _CLOSERS:
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1


def _search_structure(text: bytes, position: int) -> int:
    """``_walk_bytes`` by searching for the next bracket or quote: for CPython, where a loop per byte is slow."""
    depth = 0
    search = _STRUCTURE.search
    while True:
        position = search(text, position).start()  # type: ignore[union-attr]
        char = text[position]
        if char == _QUOTE:
            position = _string_end(text, position)
            continue
        depth += 1 if char in _OPENERS else -1
        position += 1
        if depth == 0:
            return position


_skip_container = _walk_bytes if platform.python_implementation() == "PyPy" else _search_structure


def _string_end(text: bytes, position: int) -> int:
    """Past the string that opens at ``position``: the first quote after it not escaped by a backslash."""
    while True:
        position = text.index(b'"', position + 1)
        before = position - 1
        while text[before] == _BACKSLASH:
            before -= 1
        if (position - 1 - before) % 2 == 0:
            return position + 1


def _skip_space(text: bytes, position: int) -> int:
    while text[position] in _SPACE:
        position += 1
    return position
