"""Regular expressions of collection schemas, matched in time linear in the text.

JSON Schema's ``pattern`` and ``patternProperties`` are ECMA-262 regular
expressions, and Python's ``re`` backtracks: ``^(a+)+$`` against 25 a's and
a ``!`` took 15.8 s of a worker's CPU (issue 44). This module parses the
part of ECMA-262 that has no backtracking semantics (literals, ``.``,
classes with ``\\d \\w \\s`` and their negations, escapes, ``^ $ \\b \\B``,
groups, alternation, greedy and lazy ``* + ? {n,m}``) into a Thompson NFA
and runs it as a set of states (RE2's approach), building a DFA lazily as
characters come: a character already seen in a state costs one dict lookup.
A search only answers whether the pattern matches somewhere, so greedy and
lazy quantifiers mean the same here.

Refused, with ``InvalidPattern`` naming the construct (a 422 when a setting
is written): backreferences and lookaround (no linear-time algorithm),
``\\p{…}`` property escapes (their tables are not here), patterns longer
than ``MAX_PATTERN_CHARS`` and programs longer than ``MAX_PROGRAM``
(``a{1000}{1000}`` would be a million states). What a search costs is
charged to the caller's ``charge`` (one unit each ``CHARS_A_UNIT`` characters, ``len(program)``
more for each transition not cached yet), so a validation budget can stop it.
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Optional, Tuple, Union

MAX_PATTERN_CHARS = 2000
MAX_PROGRAM = 4000
MAX_GROUP_DEPTH = 32
# A cached step is ~50 ns on PyPy, a subschema applied ~150 ns (docs/schemas.md): four characters a unit.
CHARS_A_UNIT = 4
MAX_CACHED = 20_000  # DFA transitions kept per pattern before the cache starts again

Charge = Callable[[int], None]
Matcher = Callable[[str], bool]


class InvalidPattern(ValueError):
    """A pattern this engine will not run; the message says which construct and why."""


# ECMA-262 classes: ASCII digits and word characters; its WhiteSpace and LineTerminator.
_DIGITS = (("0", "9"),)
_WORD = (("0", "9"), ("A", "Z"), ("_", "_"), ("a", "z"))
_SPACE = (*((c, c) for c in "\t\n\x0b\x0c\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"), ("\u2000", "\u200a"))
_LINE_ENDS = (("\n", "\n"), ("\r", "\r"), ("\u2028", "\u2029"))
_CLASSES = {"d": (_DIGITS, False), "D": (_DIGITS, True), "w": (_WORD, False), "W": (_WORD, True)}
_CLASSES.update({"s": (_SPACE, False), "S": (_SPACE, True)})
_CONTROL = {"t": "\t", "n": "\n", "v": "\x0b", "f": "\x0c", "r": "\r", "0": "\0"}

Ranges = Tuple[Tuple[str, str], ...]
# AST: ("set", ranges, negated) | ("cat", [..]) | ("alt", [..]) | ("rep", node, low, high) | ("assert", kind)
Node = Tuple


def _is_word(c: str) -> bool:
    return c == "_" or ("0" <= c <= "9") or ("A" <= c <= "Z") or ("a" <= c <= "z")


class _Parser:
    """Recursive descent over ECMA-262's Pattern grammar (the subset this module runs)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0
        self.depth = 0

    def fail(self, why: str) -> InvalidPattern:
        return InvalidPattern(f"pattern {self.text[:60]!r}: {why} (at character {self.at})")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def parse(self) -> Node:
        node = self.alternation()
        if self.at < len(self.text):
            raise self.fail("unbalanced ')'")
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
            items.append(self.quantified(atom) if atom[0] != "assert" else atom)
        return ("cat", items)

    def quantified(self, atom: Node) -> Node:
        c = self.peek()
        bounds: Optional[Tuple[int, Optional[int]]] = None
        if c in "*+?" and c:
            self.at += 1
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            bounds = self.braces()
        if bounds is None:
            return atom
        if self.peek() == "?":
            self.at += 1  # lazy: the same yes/no answer for a search
        if (self.peek() in ("*", "+", "?") and self.peek()) or (self.peek() == "{" and self.braces()):
            raise self.fail("nothing to repeat")
        return ("rep", atom, bounds[0], bounds[1])

    def braces(self) -> Optional[Tuple[int, Optional[int]]]:
        # "{n}", "{n,}", "{n,m}"; anything else is a literal "{" (ECMA-262 Annex B).
        end = self.text.find("}", self.at)
        body = self.text[self.at + 1 : end] if end > 0 else ""
        low, comma, high = body.partition(",")
        if not (low.isascii() and low.isdigit()) or (high and not (high.isascii() and high.isdigit())):
            return None
        self.at = end + 1
        bounds = (int(low), int(high) if high else (None if comma else int(low)))
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise self.fail("numbers out of order in {} quantifier")
        if bounds[0] > MAX_PROGRAM or (bounds[1] or 0) > MAX_PROGRAM:
            raise self.fail(f"a repetition count over {MAX_PROGRAM}")
        return bounds

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
            return ("set", _LINE_ENDS, True)
        if c == "^" or c == "$":
            return ("assert", c)
        if c in "*+?":
            raise self.fail("nothing to repeat")
        return ("set", ((c, c),), False)

    def group(self) -> Node:
        if self.text.startswith("?", self.at):
            head = self.text[self.at : self.at + 3]
            if head.startswith(("?=", "?!", "?<=", "?<!")):
                raise self.fail("lookaround is refused: it has no linear-time algorithm")
            if head.startswith("?:"):
                self.at += 2
            elif head.startswith("?<"):
                end = self.text.find(">", self.at)
                if end < 0:
                    raise self.fail("an unterminated group name")
                self.at = end + 1
            else:
                raise self.fail("an unknown group kind")
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            raise self.fail(f"groups nested deeper than {MAX_GROUP_DEPTH}")
        node = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.at += 1
        return node

    def escape(self, in_class: bool) -> Node:
        c = self.peek()
        if not c:
            raise self.fail("a pattern may not end with '\\'")
        self.at += 1
        if c in _CLASSES:
            ranges, negated = _CLASSES[c]
            return ("set", ranges, negated)
        if c in "bB" and not in_class:
            return ("assert", c)
        if c == "b":
            return _literal("\b")
        if (c.isdigit() and c != "0") or c == "k":
            raise self.fail("backreferences are refused: they have no linear-time algorithm")
        if c in "pP":
            raise self.fail("Unicode property escapes (\\p{...}) are not supported by this regular expression engine")
        if c == "0" and self.peek().isdigit():
            raise self.fail("octal escapes are refused")
        if c in _CONTROL:
            return _literal(_CONTROL[c])
        if c in "xu":
            return _literal(self.hex_escape(c))
        if c == "c" and self.peek().isascii() and self.peek().isalpha():
            self.at += 1
            return _literal(chr(ord(self.text[self.at - 1]) % 32))
        return _literal(c)  # an identity escape: "\." is "."

    def hex_escape(self, kind: str) -> str:
        if kind == "u" and self.peek() == "{":
            end = self.text.find("}", self.at)
            digits = self.text[self.at + 1 : end] if end > 0 else ""
            self.at = end + 1 if end > 0 else self.at
        else:
            digits = self.text[self.at : self.at + (2 if kind == "x" else 4)]
            self.at += len(digits)
        try:
            if not digits.isascii() or len(digits) < (2 if kind == "x" else 1):
                raise ValueError
            return chr(int(digits, 16))
        except (ValueError, OverflowError):
            raise self.fail(f"a malformed \\{kind} escape") from None

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
                if isinstance(low, str) and isinstance(high, str):
                    if high < low:
                        raise self.fail("a class range out of order")
                    ranges.append((low, high))
                    continue
                # Annex B: a class escape beside "-" makes "-" a literal.
                ranges.append(("-", "-"))
                ranges.extend([(high, high)] if isinstance(high, str) else high)
            if isinstance(low, str):
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
        if negated:
            return _complement(ranges)
        return ranges


def _literal(c: str) -> Node:
    return ("set", ((c, c),), False)


def _complement(ranges: Ranges) -> Ranges:
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


def _matcher(ranges: Ranges, negated: bool) -> Matcher:
    if not negated and len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        only = ranges[0][0]
        return lambda c: c == only
    spans = tuple(ranges)
    if negated:
        return lambda c: not any(low <= c <= high for low, high in spans)
    return lambda c: any(low <= c <= high for low, high in spans)


# -- the program: a Thompson NFA ----------------------------------------------------

_CHAR, _SPLIT, _JMP, _ASSERT, _MATCH = range(5)
_START, _WORDY, _OTHER = range(3)  # what came before a position: nothing, a word character, another


class _Emitter:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.program: List[list] = []

    def add(self, *instruction: object) -> int:
        if len(self.program) >= MAX_PROGRAM:
            raise InvalidPattern(
                f"pattern {self.pattern[:60]!r} expands to more than {MAX_PROGRAM} states (repetitions multiply)"
            )
        self.program.append(list(instruction))
        return len(self.program) - 1

    def emit(self, node: Node) -> None:
        kind = node[0]
        if kind == "set":
            self.add(_CHAR, _matcher(node[1], node[2]))
        elif kind == "assert":
            self.add(_ASSERT, node[1])
        elif kind == "cat":
            for item in node[1]:
                self.emit(item)
        elif kind == "alt":
            self.alternatives(node[1])
        else:
            self.repeat(node[1], node[2], node[3])

    def alternatives(self, branches: List[Node]) -> None:
        jumps = []
        for branch in branches[:-1]:
            split = self.add(_SPLIT, 0, 0)
            self.program[split][1] = split + 1
            self.emit(branch)
            jumps.append(self.add(_JMP, 0))
            self.program[split][2] = len(self.program)
        self.emit(branches[-1])
        for jump in jumps:
            self.program[jump][1] = len(self.program)

    def repeat(self, node: Node, low: int, high: Optional[int]) -> None:
        for _ in range(low):
            self.emit(node)
        if high is None:
            split = self.add(_SPLIT, 0, 0)
            self.program[split][1] = split + 1
            self.emit(node)
            self.add(_JMP, split)
            self.program[split][2] = len(self.program)
            return
        splits = []
        for _ in range(high - low):
            split = self.add(_SPLIT, 0, 0)
            self.program[split][1] = split + 1
            splits.append(split)
            self.emit(node)
        for split in splits:
            self.program[split][2] = len(self.program)


class _State:
    """A DFA state: the NFA's character steps pending, and what the last character was."""

    __slots__ = ("dead", "end", "kind", "moves", "pcs")

    def __init__(self, pcs: FrozenSet[int], kind: int, dead: bool) -> None:
        self.pcs = pcs
        self.kind = kind
        self.moves: Dict[str, object] = {}
        self.end: Optional[bool] = None
        self.dead = dead


_MATCHED = object()


class Regex:
    """One compiled pattern; ``search(text)`` says whether it matches anywhere in ``text``."""

    def __init__(self, pattern: str, program: List[list], anchored: bool) -> None:
        self.pattern = pattern
        self.program = [tuple(instruction) for instruction in program]
        self.anchored = anchored  # every match starts at 0: once no state is left, none can come
        self.states: Dict[Tuple[FrozenSet[int], int], _State] = {}
        self.cached = 0
        self.start = self._state(frozenset(), _START)

    def search(self, text: str, charge: Optional[Charge] = None) -> bool:
        if charge is not None:
            charge(len(text) // CHARS_A_UNIT + 1)
        state = self.start
        for c in text:
            move = state.moves.get(c)
            if move is None:
                move = self._move(state, c, charge)
            if move is _MATCHED:
                return True
            state = move  # type: ignore[assignment]
            if state.dead:
                return False
        if state.end is None:
            state.end = self._closure(state, "")[1]
        return state.end

    def _state(self, pcs: FrozenSet[int], kind: int) -> _State:
        key = (pcs, kind)
        found = self.states.get(key)
        if found is None:
            found = self.states[key] = _State(pcs, kind, self.anchored and not pcs and kind != _START)
        return found

    def _move(self, state: _State, c: str, charge: Optional[Charge]) -> object:
        if charge is not None:
            charge(len(self.program))
        steps, matched = self._closure(state, c)
        if matched:
            move: object = _MATCHED
        else:
            pcs = frozenset(pc + 1 for pc in steps if self.program[pc][1](c))
            move = self._state(pcs, _WORDY if _is_word(c) else _OTHER)
        if self.cached >= MAX_CACHED:
            # A bounded cache: start again rather than hold every state a text can reach.
            for known in self.states.values():
                known.moves.clear()
            self.states.clear()
            self.cached = 0
        state.moves[c] = move
        self.cached += 1
        return move

    def _closure(self, state: _State, c: str) -> Tuple[List[int], bool]:
        """The character steps reachable without reading, before ``c`` ("" at the end); and whether one matched."""
        program = self.program
        before_word = state.kind == _WORDY
        after_word = c != "" and _is_word(c)
        seen = set()
        stack = [0, *state.pcs]
        steps: List[int] = []
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            op = program[pc][0]
            if op == _CHAR:
                steps.append(pc)
            elif op == _MATCH:
                return steps, True
            elif op == _JMP:
                stack.append(program[pc][1])
            elif op == _SPLIT:
                stack.append(program[pc][2])
                stack.append(program[pc][1])
            elif _holds(program[pc][1], state.kind, before_word, after_word, c):
                stack.append(pc + 1)
        return steps, False


def _holds(assertion: str, kind: int, before_word: bool, after_word: bool, c: str) -> bool:
    if assertion == "^":
        return kind == _START
    if assertion == "$":
        return c == ""
    return (before_word != after_word) == (assertion == "b")


def compile_pattern(pattern: str) -> Regex:
    """``pattern`` ready to search; ``InvalidPattern`` says why not."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidPattern(f"a pattern of {len(pattern)} characters; the limit is {MAX_PATTERN_CHARS}")
    tree = _Parser(pattern).parse()
    emitter = _Emitter(pattern)
    emitter.emit(tree)
    emitter.program.append([_MATCH])
    items = tree[1] if tree[0] == "cat" else [tree]
    anchored = bool(items) and items[0] == ("assert", "^")
    return Regex(pattern, emitter.program, anchored)
