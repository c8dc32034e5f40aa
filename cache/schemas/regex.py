"""Regular expressions of collection schemas, matched in time linear in the text.

JSON Schema's ``pattern`` and ``patternProperties`` are ECMA-262 regular
expressions, and Python's ``re`` backtracks: ``^(a+)+$`` against 25 a's and
a ``!`` took seconds of a worker's CPU (issue 44; docs/schemas.md, "Regular
expressions"). This module runs the
part of ECMA-262 that has no backtracking semantics (literals, ``.``,
classes with ``\\d \\w \\s`` and their negations, escapes, ``^ $ \\b \\B``,
groups, alternation, greedy and lazy ``* + ? {n,m}``), read as the ``u``
flag reads it (``cache.schemas.regex_syntax`` parses, and says why that mode), as
a Thompson NFA run as a set of states (RE2's approach), building a DFA
lazily as characters come: a character already seen in a state costs one
dict lookup. A search only answers whether the pattern matches somewhere,
so greedy and lazy quantifiers mean the same here.

Refused, with ``InvalidPattern`` naming the construct (a 422 when a setting
is written): a pattern that is not ECMA-262; and, as ``UnsupportedPattern``,
backreferences and lookaround (no linear-time algorithm), ``\\p{…}``
property escapes (their tables are not here), patterns longer than
``MAX_PATTERN_CHARS`` and programs longer than ``MAX_PROGRAM``
(``a{1000}{1000}`` would be a million states). What a search costs is
charged to the caller's ``charge`` (one unit each ``CHARS_A_UNIT``
characters, ``len(program)`` more for each transition not cached yet), so
a validation budget can stop it.
"""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from cache.schemas.regex_syntax import MAX_GROUP_DEPTH, InvalidPattern, Node, Ranges, UnsupportedPattern, parse

__all__ = ["MAX_GROUP_DEPTH", "InvalidPattern", "Regex", "UnsupportedPattern", "compile_pattern"]

MAX_PATTERN_CHARS = 2000
MAX_PROGRAM = 4000
# A cached step of the DFA costs a fraction of a subschema applied, the budget's unit (docs/schemas.md,
# "Regular expressions" and "Per document"): four characters a unit.
CHARS_A_UNIT = 4
MAX_CACHED = 20_000  # DFA transitions kept per pattern before the cache starts again

Charge = Callable[[int], None]
Matcher = Callable[[str], bool]


def _is_word(c: str) -> bool:
    return c == "_" or ("0" <= c <= "9") or ("A" <= c <= "Z") or ("a" <= c <= "z")


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
            raise UnsupportedPattern(
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
        mark = len(self.program)
        self.emit(node)
        if len(self.program) == mark:
            return  # it emits nothing ("(){4000}"), so neither do its copies; looping over them is time for nothing
        del self.program[mark:]
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
        raise UnsupportedPattern(f"a pattern of {len(pattern)} characters; the limit is {MAX_PATTERN_CHARS}")
    tree = parse(pattern, MAX_PROGRAM)
    emitter = _Emitter(pattern)
    emitter.emit(tree)
    emitter.program.append([_MATCH])
    items = tree[1] if tree[0] == "cat" else [tree]
    anchored = bool(items) and items[0] == ("assert", "^")
    return Regex(pattern, emitter.program, anchored)
