"""The syntax of collection-schema patterns: ECMA-262 with the ``u`` flag, parsed into a tree.

JSON Schema's ``pattern`` is an ECMA-262 regular expression, and ECMA-262
has two grammars: without the ``u`` flag, Annex B reads a malformed escape
as some other pattern (``\\x+1`` is ``x+1``, ``\\c1`` is ``\\c1``
literally, ``\\u41`` is ``u41``); with it, each is a syntax error. Jetway
follows the ``u`` flag throughout, as ``new RegExp(p, "u")`` of Node 20
(ECMA-262 2024) does, so that a pattern means one thing or is refused:
identity escapes are only of ``^$\\.*+?()[]{}|/`` (and ``\\-`` in a class),
a lone ``{``, ``}`` or ``]`` is an error, an assertion takes no quantifier,
``\\x`` takes two hex digits and ``\\u`` four (or ``{…}`` up to 10FFFF,
and a ``\\uD83D\\uDE00`` pair is one code point), ``\\c`` a letter, ``\\0``
no digit after it, ``\\1`` and ``\\k<name>`` a group that exists, and a
class range no ``\\d``-like end. Matching is by code point.
``tests/cache/regex_differential.py`` holds this to Node over generated
patterns.

Two refusals: ``InvalidPattern``, a pattern that is not ECMA-262; and its
subclass ``UnsupportedPattern``, one that is but that ``cache.schemas.regex`` does
not run (backreferences, lookaround, ``\\p{…}``, sizes over its bounds). A
pattern is parsed to its end before an ``UnsupportedPattern`` is raised, so
a syntax error anywhere is reported as one.
"""

from __future__ import annotations

import re
from typing import List, Optional, Set, Tuple, Union

MAX_GROUP_DEPTH = 32

Ranges = Tuple[Tuple[str, str], ...]
# ("set", ranges, negated) | ("cat", [..]) | ("alt", [..]) | ("rep", node, low, high) | ("assert", kind)
Node = Tuple

# ECMA-262 classes: ASCII digits and word characters; its WhiteSpace and LineTerminator.
_DIGITS = (("0", "9"),)
_WORD = (("0", "9"), ("A", "Z"), ("_", "_"), ("a", "z"))
_SPACE = (*((c, c) for c in "\t\n\x0b\x0c\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"), ("\u2000", "\u200a"))
LINE_ENDS = (("\n", "\n"), ("\r", "\r"), ("\u2028", "\u2029"))
_CLASSES = {"d": (_DIGITS, False), "D": (_DIGITS, True), "w": (_WORD, False), "W": (_WORD, True)}
_CLASSES.update({"s": (_SPACE, False), "S": (_SPACE, True)})
_CONTROL = {"t": "\t", "n": "\n", "v": "\x0b", "f": "\x0c", "r": "\r"}
_SYNTAX = "^$\\.*+?()[]{}|"
# Lexing these fixed shapes with re is safe: none of them can backtrack more than linearly.
_QUANTIFIER = re.compile(r"\{([0-9]+)(?:(,)([0-9]*))?\}")
_HEX = re.compile(r"[0-9a-fA-F]+")
_PROPERTY = re.compile(r"\{[A-Za-z_]+(?:=[A-Za-z0-9_]+)?\}")
_DIGIT_RUN = re.compile("[0-9]*")
_NOTHING: Node = ("set", (), False)  # what a refused construct parses to: it is never run


class InvalidPattern(ValueError):
    """A pattern this engine will not run; the message says which construct and why."""


class UnsupportedPattern(InvalidPattern):
    """A valid ECMA-262 pattern that ``schemas.regex`` does not run (no linear-time algorithm, no tables, too big)."""


def literal(c: str) -> Node:
    return ("set", ((c, c),), False)


def complement(ranges: Ranges) -> Ranges:
    """The code points not in ``ranges`` (for ``\\D`` inside a class)."""
    out: List[Tuple[str, str]] = []
    start = 0
    for low, high in sorted(ranges):
        if ord(low) > start:
            out.append((chr(start), chr(ord(low) - 1)))
        start = max(start, ord(high) + 1)
    if start <= 0x10FFFF:
        out.append((chr(start), chr(0x10FFFF)))
    return tuple(out)


def _identifier(c: str, first: bool) -> bool:
    # ECMA's ID_Start/ID_Continue, as Python's XID_* approximate them (they differ on a few compatibility characters).
    if c in "$_" or (not first and c in "\u200c\u200d"):
        return True
    return c.isidentifier() if first else ("a" + c).isidentifier()


class Parser:
    """Recursive descent over ECMA-262's Pattern grammar with the ``u`` flag; ``parse()`` gives the tree."""

    def __init__(self, pattern: str, max_count: int) -> None:
        self.text = pattern
        self.at = 0
        self.depth = 0
        self.max_count = max_count
        self.groups = 0
        self.names: Set[str] = set()
        self.references: List[Union[int, str]] = []
        self.refused: Optional[UnsupportedPattern] = None

    def fail(self, why: str) -> InvalidPattern:
        return InvalidPattern(f"pattern {self.text[:60]!r}: {why} (at character {self.at})")

    def refuse(self, why: str) -> None:
        # Remembered, not raised: the rest of the pattern may still hold a syntax error, which is what to report.
        if self.refused is None:
            self.refused = UnsupportedPattern(f"pattern {self.text[:60]!r}: {why} (at character {self.at})")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def parse(self) -> Node:
        node = self.alternation()
        if self.at < len(self.text):
            raise self.fail("unbalanced ')'")
        for reference in self.references:
            if reference not in self.names and not (isinstance(reference, int) and reference <= self.groups):
                raise self.fail(f"a backreference to a group the pattern does not have: {reference!r}")
        if self.refused is not None:
            raise self.refused
        return node

    def alternation(self) -> Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self) -> Node:
        items: List[Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            # With the u flag no assertion (^ $ \b \B lookaround) takes a quantifier: the next atom() refuses it.
            items.append(self.quantified(atom) if atom[0] != "assert" else atom)
        return ("cat", items)

    def quantified(self, atom: Node) -> Node:
        c = self.peek()
        bounds: Optional[Tuple[int, Optional[int]]] = None
        if c and c in "*+?":
            self.at += 1
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            bounds = self.braces()
        if bounds is None:
            return atom
        if self.peek() == "?":
            self.at += 1  # lazy: the same yes/no answer for a search
        return ("rep", atom, bounds[0], bounds[1])

    def braces(self) -> Optional[Tuple[int, Optional[int]]]:
        """``{n}``, ``{n,}`` or ``{n,m}`` at ``self.at``; None if there is none (a lone ``{``, an error)."""
        found = _QUANTIFIER.match(self.text, self.at)
        if found is None:
            return None
        self.at = found.end()
        low = int(found[1])
        high = int(found[3]) if found[3] else (None if found[2] else low)
        if high is not None and high < low:
            raise self.fail("numbers out of order in {} quantifier")
        if max(low, high or 0) > self.max_count:
            self.refuse(f"a repetition count over {self.max_count}")
        return (low, high)

    def atom(self) -> Node:
        c = self.peek()
        self.at += 1
        if c == "(":
            return self.group()
        if c == "[":
            return self.char_class()
        if c == "\\":
            return self.escape(in_class=False)
        if c == ".":
            return ("set", LINE_ENDS, True)
        if c == "^" or c == "$":
            return ("assert", c)
        if c in "*+?" or (c == "{" and _QUANTIFIER.match(self.text, self.at - 1)):
            raise self.fail("nothing to repeat")
        if c in "{}]":
            raise self.fail(f"a lone {c!r} (with the u flag it is an error: write '\\{c}')")
        return literal(c)

    def group(self) -> Node:
        look = False
        if self.text.startswith(("?=", "?!", "?<=", "?<!"), self.at):
            look = True
            self.at += 3 if self.text.startswith("?<", self.at) else 2
        elif self.text.startswith("?:", self.at):
            self.at += 2
        elif self.text.startswith("?<", self.at):
            self.at += 2
            name = self.group_name()
            if name in self.names:
                raise self.fail(f"a group name used twice: {name!r}")
            self.names.add(name)
            self.groups += 1
        elif self.peek() == "?":
            raise self.fail("an unknown group kind")
        else:
            self.groups += 1
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            raise UnsupportedPattern(f"pattern {self.text[:60]!r}: groups nested deeper than {MAX_GROUP_DEPTH}")
        node = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.at += 1
        if look:
            self.refuse("lookaround is refused: it has no linear-time algorithm")
            return ("assert", "look")
        return node

    def group_name(self) -> str:
        """A ``RegExpIdentifierName`` and its ``>``, ``\\u`` escapes read."""
        chars: List[str] = []
        while not (self.peek() == ">" and chars):
            c = self.peek()
            self.at += 1
            if c == "\\" and self.peek() == "u":
                self.at += 1
                c = self.unicode_escape()
            if not c or not _identifier(c, first=not chars):
                raise self.fail("a group name must be an identifier, then '>'")
            chars.append(c)
        self.at += 1
        return "".join(chars)

    def escape(self, in_class: bool) -> Node:
        c = self.peek()
        if not c:
            raise self.fail("a pattern may not end with '\\'")
        self.at += 1
        if c in _CLASSES:
            ranges, negated = _CLASSES[c]
            return ("set", ranges, negated)
        if c in "pP":
            return self.property_escape()
        if c in "bB" and not in_class:
            return ("assert", c)
        if "1" <= c <= "9" and not in_class:
            return self.backreference(c)
        if c == "k" and not in_class:
            if self.peek() != "<":
                raise self.fail("\\k must name a group: \\k<name>")
            self.at += 1
            self.references.append(self.group_name())
            self.refuse("backreferences are refused: they have no linear-time algorithm")
            return _NOTHING
        return literal(self.character_escape(c, in_class))

    def character_escape(self, c: str, in_class: bool) -> str:
        """The character ``\\`` then ``c`` (and what follows) stands for."""
        if c == "0":
            if "0" <= self.peek() <= "9":
                raise self.fail("octal escapes are an error with the u flag (\\0 takes no digit after it)")
            return "\0"
        if c in _CONTROL:
            return _CONTROL[c]
        if c == "c":
            letter = self.peek()
            if not (letter.isascii() and letter.isalpha()):
                raise self.fail("\\c must be followed by a letter A-Z or a-z")
            self.at += 1
            return chr(ord(letter) % 32)
        if c == "x":
            return chr(self.hex_digits(2, "x"))
        if c == "u":
            return self.unicode_escape()
        if (in_class and c in "b-") or c in _SYNTAX or c == "/":
            return "\b" if (in_class and c == "b") else c
        raise self.fail(f"'\\{c}' is no escape (with the u flag only ^$\\.*+?()[]{{}}|/ may be escaped)")

    def hex_digits(self, count: int, kind: str) -> int:
        digits = self.text[self.at : self.at + count]
        if len(digits) != count or not _HEX.fullmatch(digits):
            raise self.fail(f"a malformed \\{kind} escape: it takes exactly {count} hex digits")
        self.at += count
        return int(digits, 16)

    def unicode_escape(self) -> str:
        """After ``\\u``: ``XXXX``, a ``\\uXXXX\\uXXXX`` surrogate pair as one code point, or ``{X…}``."""
        if self.peek() == "{":
            found = _HEX.match(self.text, self.at + 1)
            if found is None or not self.text.startswith("}", found.end()) or int(found[0], 16) > 0x10FFFF:
                raise self.fail("a malformed \\u{...} escape: it takes hex digits up to 10FFFF")
            self.at = found.end() + 1
            return chr(int(found[0], 16))
        code = self.hex_digits(4, "u")
        trail = self.text[self.at + 2 : self.at + 6] if self.text.startswith("\\u", self.at) else ""
        if 0xD800 <= code <= 0xDBFF and _HEX.fullmatch(trail) and 0xDC00 <= int(trail, 16) <= 0xDFFF:
            self.at += 6
            return chr(0x10000 + ((code - 0xD800) << 10) + int(trail, 16) - 0xDC00)
        return chr(code)

    def property_escape(self) -> Node:
        found = _PROPERTY.match(self.text, self.at)
        if found is None:
            raise self.fail("\\p and \\P take a property in braces: \\p{Letter}")
        self.at = found.end()
        self.refuse("Unicode property escapes (\\p{...}) are not supported by this regular expression engine")
        return _NOTHING

    def backreference(self, first: str) -> Node:
        digits = _DIGIT_RUN.match(self.text, self.at)[0]  # type: ignore[index]
        self.at += len(digits)
        self.references.append(int(first + digits))
        self.refuse("backreferences are refused: they have no linear-time algorithm")
        return _NOTHING

    def char_class(self) -> Node:
        negated = self.peek() == "^"
        self.at += negated
        ranges: List[Tuple[str, str]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.fail("missing ']'")
            low = self.class_atom()
            if self.peek() == "-" and self.text[self.at + 1 : self.at + 2] not in ("]", ""):
                self.at += 1
                high = self.class_atom()
                if not (isinstance(low, str) and isinstance(high, str)):
                    raise self.fail("a class escape (\\d, \\w, \\s…) cannot end a range (the u flag makes it an error)")
                if high < low:
                    raise self.fail("a class range out of order")
                ranges.append((low, high))
            elif isinstance(low, str):
                ranges.append((low, low))
            else:
                ranges.extend(low)
        self.at += 1
        return ("set", tuple(ranges), negated)

    def class_atom(self) -> Union[str, Ranges]:
        c = self.peek()
        self.at += 1
        if c != "\\":
            return c
        node = self.escape(in_class=True)
        ranges, negated = node[1], node[2]
        if not negated and len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return str(ranges[0][0])
        return complement(ranges) if negated else ranges


def parse(pattern: str, max_count: int) -> Node:
    """The tree of ``pattern``; ``InvalidPattern`` if not ECMA-262 (``u`` flag), ``UnsupportedPattern`` if not run."""
    return Parser(pattern, max_count).parse()
