"""RFC 8259's grammar, checked exactly: the judge of a text the fast parser refused.

``cache.json.codec`` parses a body with the interpreter's fast parser and comes
here only when that parser refused it or saw something unusual (a number
that is not finite, nesting deeper than its stack). The stdlib's
pure-Python decoder, which the codec then uses for its hooks, is laxer than
the grammar: it reads ``\\u`` escapes with ``int(…, 16)``, which takes
``" 123"``, ``"+123"``, ``"1_23"``, ``"-123"`` (then a 500) and non-ASCII
digits (a fullwidth eight in ``"D8..."``), and its number pattern's ``\\d``
matches any Unicode digit (an Arabic-Indic one after ``1``). So no text
reaches it that this scanner has not passed.

Exactly the grammar: whitespace is space, tab, LF and CR; a string holds
no control character, its escapes are ``\\" \\\\ \\/ \\b \\f \\n \\r \\t``
and ``\\u`` with exactly four ASCII hex digits; a number is
``-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?`` in ASCII digits; the
literals are ``true``, ``false`` and ``null``. Nesting is followed with a
list, not recursion, and is refused past ``MAX_DEPTH`` (RFC 8259 lets a
parser limit it): the hooked parser that reads what passes here runs out
of stack near 1,000 levels anyway, and 1 MiB of ``[`` is refused after
1,000 steps, not walked to its end. What it cannot see is
I-JSON's (``cache.json.i_json``) and the numbers' range (the codec's).
"""

from __future__ import annotations

import re
from typing import List

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_PLAIN = r'[^"\\\x00-\x1f]*'
_ESCAPE = r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})'
# Unrolled (plain run, then escape and plain run, repeated): the parts
# exclude each other, so a failed match does not backtrack.
_STRING_BODY = _PLAIN + "(?:" + _ESCAPE + _PLAIN + ")*"
_STRING = re.compile('"' + _STRING_BODY + '"')
_STRING_PREFIX = re.compile('"' + _STRING_BODY)
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS = ("true", "false", "null")
_CLOSER = {"{": "}", "[": "]"}
MAX_DEPTH = 1_000


class GrammarError(ValueError):
    """The text is not RFC 8259 JSON; the message says what and where."""

    def __init__(self, what: str, text: str, position: int) -> None:
        line = text.count("\n", 0, position) + 1
        column = position - text.rfind("\n", 0, position)
        super().__init__(f"{what}: line {line} column {column} (char {position})")


class TooDeep(GrammarError):
    """Nested deeper than ``MAX_DEPTH``."""


def check(text: str) -> None:
    """Return if ``text`` is one JSON value with optional whitespace around it, else raise ``GrammarError``."""
    closers: List[str] = []
    position = _skip(text, 0)
    while True:
        depth = len(closers)
        position = _value(text, position, closers)
        if len(closers) > depth:
            continue  # a container opened: its first value is next
        position = _after_value(text, position, closers)
        if not closers:
            if position != len(text):
                raise GrammarError("extra data after the value", text, position)
            return


def _skip(text: str, position: int) -> int:
    return _WHITESPACE.match(text, position).end()  # type: ignore[union-attr]


def _value(text: str, position: int, closers: List[str]) -> int:
    """Past a scalar or an empty container; or, having pushed its closer, to a container's first value."""
    char = text[position : position + 1]
    if char in _CLOSER:
        if len(closers) == MAX_DEPTH:
            raise TooDeep(f"nested deeper than {MAX_DEPTH} levels", text, position)
        inside = _skip(text, position + 1)
        if text[inside : inside + 1] == _CLOSER[char]:
            return inside + 1
        closers.append(_CLOSER[char])
        return _member_name(text, inside) if char == "{" else inside
    if char == '"':
        return _string(text, position)
    for literal in _LITERALS:
        if text.startswith(literal, position):
            return position + len(literal)
    number = _NUMBER.match(text, position)
    if number is None:
        for constant in ("NaN", "Infinity", "-Infinity"):
            if text.startswith(constant, position):
                raise GrammarError(f"{constant} is not a JSON value", text, position)
        raise GrammarError("expecting a value", text, position)
    return number.end()


def _after_value(text: str, position: int, closers: List[str]) -> int:
    """Past closing brackets and one comma (and a member's name): where the next value starts, or the end."""
    while True:
        position = _skip(text, position)
        if not closers:
            return position
        char = text[position : position + 1]
        if char == closers[-1]:
            closers.pop()
            position += 1
        elif char == ",":
            position = _skip(text, position + 1)
            return _member_name(text, position) if closers[-1] == "}" else position
        else:
            raise GrammarError(f"expecting ',' or {closers[-1]!r}", text, position)


def _member_name(text: str, position: int) -> int:
    """Past a member's name, its colon and the whitespace after it."""
    if text[position : position + 1] != '"':
        raise GrammarError("expecting a member name in double quotes", text, position)
    position = _skip(text, _string(text, position))
    if text[position : position + 1] != ":":
        raise GrammarError("expecting ':'", text, position)
    return _skip(text, position + 1)


def _string(text: str, position: int) -> int:
    match = _STRING.match(text, position)
    if match is not None:
        return match.end()
    stop = _STRING_PREFIX.match(text, position).end()  # type: ignore[union-attr]
    if stop == len(text):
        raise GrammarError("unterminated string", text, position)
    if text[stop] == "\\":
        raise GrammarError("invalid escape (\\u takes four ASCII hex digits)", text, stop)
    raise GrammarError(f"control character U+{ord(text[stop]):04X} in a string", text, stop)
