"""cache.schemas.regex held to Node's ``new RegExp(p, "u")`` over generated patterns and subject strings.

A pattern is drawn from a grammar that mixes ECMA-262's constructs with the
malformed ones the ``u`` flag makes errors (``\\x+1``, ``\\u41``,
``\\u{110000}``, ``\\c1``, ``\\k``, ``\\01``, ``\\-``, a lone ``{``, ``[\\d-z]``…),
with a sample string it may match; subjects are the sample, its mutations and
random strings over the pattern's characters. For each pattern Node says
SyntaxError or whether it matches each subject; ``cache.schemas.regex`` must agree:
a SyntaxError is an ``InvalidPattern`` that is not an ``UnsupportedPattern``;
a valid pattern either matches each subject as Node does or is an
``UnsupportedPattern`` (backreferences, lookaround, ``\\p{…}``). One ``node``
process answers a whole batch (``regex_node.js``: JSON in, JSON out). The
engine follows ECMA-262 2024, Node 20's edition; a newer node that accepts
later syntax (``LATER``) has those patterns counted apart, not as errors.

By hand, a big run: ``.venv/bin/python -m tests.cache.regex_differential 20000``.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from cache.schemas.regex import InvalidPattern, UnsupportedPattern, compile_pattern

NODE_SCRIPT = Path(__file__).with_name("regex_node.js")
BATCH = 4000
Piece = Tuple[str, str]  # a pattern's text and a string it may match
Answer = Optional[List[bool]]
# Syntax after ECMA-262 2024 (Node 20), which cache.schemas.regex refuses: when the node at hand has it, a pattern
# using it is counted apart. Each is named as regex_node.js names it, with the words of cache.schemas.regex's refusal.
LATER = {"modifiers": "an unknown group kind", "duplicate-names": "a group name used twice"}

LETTERS = "ab-x_ 0Az\u00e9\U0001f600\n/,:=\u2028"
HEXISH = "0123456789abcdefABCDEF+ _-xgG}{"
SUBJECT_CHARS = "abxAz_0 -\n\r\u2028\t\x00\x01\x08\x0b{}[]\\\u00e9\U0001f600\ud83d\ude00\u3000"
_SAMPLES = {
    "t": "\t", "n": "\n", "v": "\x0b", "f": "\x0c", "r": "\r", "d": "09\u0663", "w": "azAZ_09\u00e9",
    "s": " \t\n\x0b\x0c\r\xa0\u1680\u2000\u200a\u200b\u2028\u2029\u202f\u205f\u3000\ufeff\x85\u180e",
}  # fmt: skip
_SAMPLES.update({"D": _SAMPLES["d"] + "a", "W": _SAMPLES["w"] + "-", "S": _SAMPLES["s"] + "a"})
NAMES = ["a", "b1", "$x", "_", "\u00e9t\u00e9", "\\u0061", "\\u{62}", "1a", "a-b", "", "\u03c0", "\u4e2d", "a\u200c",
         "\\u0031", "\\uD835\\uDC9C", "\U0001d49c", "a\\x41", "\u0663", "x\u0663"]  # fmt: skip


def node() -> Optional[str]:
    return shutil.which("node")


def _joined(text: str) -> str:
    # A lead and a trail surrogate side by side are one code point in JavaScript; make them one in Python too.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


class Generator:
    """Random patterns (with a string each may match) from one seed; half of them may hold malformed pieces."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.wild = 0.0

    def pattern(self) -> Piece:
        self.wild = self.rng.choice([0.0, 0.0, 0.1, 0.4])
        return self.alternation(0)

    def pick(self, valid: Sequence[Piece], malformed: Sequence[Piece]) -> Piece:
        return self.rng.choice(malformed if malformed and self.rng.random() < self.wild else valid)

    def alternation(self, depth: int) -> Piece:
        branches = [self.sequence(depth) for _ in range(1 + (self.rng.random() < 0.25) * self.rng.randint(1, 2))]
        return "|".join(text for text, _ in branches), self.rng.choice(branches)[1]

    def sequence(self, depth: int) -> Piece:
        pieces = [self.quantified(depth) for _ in range(self.rng.randint(0, 4))]
        return "".join(text for text, _ in pieces), "".join(sample for _, sample in pieces)

    def quantified(self, depth: int) -> Piece:
        text, sample = self.atom(depth)
        if self.rng.random() < 0.65:
            return text, sample
        low, high = self.rng.randint(0, 3), self.rng.randint(0, 4)
        quantifier, times = self.pick(
            [("*", 2), ("+", 1), ("?", 0), (f"{{{low}}}", low), (f"{{{low},}}", low + 1), (f"{{{low},{high}}}", low),
             ("{4001}", 1), ("{0,99999}", 1), (f"{{{low},{low}}}", low)],
            [("{", 1), (f"{{,{high}}}", 1), (f"{{{low}", 1), (f"{{ {low}}}", 1), (f"{{{low},{high},1}}", 1),
             ("{2147483648}", 1), ("*+", 1), ("{1}{2}", 1), ("{01}", 1)],
        )  # fmt: skip
        lazy = "?" if self.rng.random() < 0.2 else ""
        return text + quantifier + lazy, sample * times

    def atom(self, depth: int) -> Piece:
        roll = self.rng.random()
        if roll < 0.3:
            c = self.rng.choice(LETTERS)
            return c, c
        if roll < 0.55:
            return self.escape(in_class=False)
        if roll < 0.72:
            return self.char_class()
        if roll < 0.85 and depth < 3:
            return self.group(depth + 1)
        return self.pick(
            [("^", ""), ("$", ""), (".", self.rng.choice(SUBJECT_CHARS))],
            [("{", "{"), ("}", "}"), ("]", "]"), (")", "")],
        )

    def group(self, depth: int) -> Piece:
        name = self.rng.choice(NAMES)
        head, _ = self.pick(
            [("(", ""), ("(?:", ""), (f"(?<{name}>", ""), ("(?=", ""), ("(?!", ""), ("(?<=", ""), ("(?<!", "")],
            [("(?i:", ""), ("(?", ""), ("(?<", ""), ("(?P<a>", "")],
        )
        text, sample = self.alternation(depth)
        tail = ")" if self.rng.random() >= self.wild / 4 else ""
        return head + text + tail, sample

    def char_class(self) -> Piece:
        items: List[Piece] = []
        for _ in range(self.rng.randint(0, 3)):
            low = self.class_atom()
            if self.rng.random() < 0.3:
                high = self.class_atom()
                items.append((f"{low[0]}-{high[0]}", self.rng.choice([low[1], high[1]])))
            else:
                items.append(low)
        negated = "^" if self.rng.random() < 0.2 else ""
        end = "]" if self.rng.random() >= self.wild / 4 else ""
        sample = self.rng.choice(items)[1] if items and not negated else self.rng.choice(SUBJECT_CHARS)
        return "[" + negated + "".join(text for text, _ in items) + end, sample

    def class_atom(self) -> Piece:
        if self.rng.random() < 0.55:
            c = self.rng.choice(LETTERS + "-[(|{.*$^")
            return c, c
        return self.escape(in_class=True)

    def escape(self, in_class: bool) -> Piece:
        kind = self.rng.randint(0, 11)
        if kind <= 1:
            width = 2 if kind == 0 else 4
            digits = "".join(self.rng.choice(HEXISH[:22]) for _ in range(width))
            wrong = "".join(self.rng.choice(HEXISH) for _ in range(self.rng.randint(0, width + 1)))
            return self.pick([("\\" + "xu"[kind] + digits, _decoded(digits))], [("\\" + "xu"[kind] + wrong, "")])
        if kind == 2:
            value = self.rng.choice([0x41, 0x0, 0xE9, 0x1F600, 0x10FFFF, 0xD83D, 0xDE00, 0x2028, 0x3000])
            digits = "0" * self.rng.randint(0, 3) + format(value, self.rng.choice("xX"))
            return self.pick(
                [("\\u{" + digits + "}", chr(value))],
                [("\\u{110000}", ""), ("\\u{}", ""), ("\\u{g}", ""), ("\\u{4 1}", ""), ("\\u{+41}", ""),
                 ("\\u{" + digits, "")],
            )  # fmt: skip
        if kind == 3:
            c = self.rng.choice("aZjz")
            return self.pick([("\\c" + c, chr(ord(c) % 32))], [("\\c1", ""), ("\\c_", ""), ("\\c", ""), ("\\c ", "")])
        if kind == 4:
            return self.rng.choice(
                [("\\uD83D\\uDE00", "\U0001f600"), ("\\uD83D", "\ud83d"), ("\\uDE00", "\ude00"),
                 ("\\uD83D\\u0041", "\ud83dA"), ("\\uD83D\\u{DE00}", "\ud83d\ude00")]
            )  # fmt: skip
        if kind == 5:
            return self.pick([("\\0", "\x00")], [("\\00", ""), ("\\01", ""), ("\\08", ""), ("\\1", ""), ("\\2", ""),
                                               ("\\10", ""), ("\\9", "")])  # fmt: skip
        if kind == 6:
            name = self.rng.choice(NAMES)
            return self.pick([(f"\\k<{name}>", "")], [("\\k", ""), ("\\k<", ""), (f"\\k<{name}", "")])
        if kind == 7:
            return self.pick(
                [("\\p{L}", "a"), ("\\P{Letter}", "1"), ("\\p{Script=Greek}", "\u03b1")],
                [("\\pL", ""), ("\\p{}", ""), ("\\p", ""), ("\\p{L", "")],
            )
        if kind in (8, 10, 11):
            c = self.rng.choice("tnvfrdDwWsSbB" if kind == 8 else "dDwWsS")
            return "\\" + c, self.rng.choice(_SAMPLES.get(c, SUBJECT_CHARS))
        valid = [("\\" + c, c) for c in "^$\\.*+?()[]{}|/" + ("-" if in_class else "")]
        return self.pick(valid, [("\\" + c, c) for c in "aeEzZ_ 0-\u00e9"])

    def subjects(self, pattern: str, sample: str) -> List[str]:
        pool = SUBJECT_CHARS + pattern
        found = [sample, "x" + sample + "y", sample[1:], sample[:-1], sample + sample]
        for _ in range(2):
            cut = self.rng.randint(0, len(sample))
            found.append(sample[:cut] + self.rng.choice(pool) + sample[cut + 1 :])
        found.extend("".join(self.rng.choice(pool) for _ in range(self.rng.randint(0, 6))) for _ in range(3))
        return [_joined(subject[:24]) for subject in found]


def _decoded(digits: str) -> str:
    try:
        return chr(int(digits, 16))
    except ValueError:
        return digits


@dataclass
class Tally:
    """What a run compared, and where the two implementations differed."""

    patterns: int = 0
    syntax_errors: int = 0
    unsupported: int = 0
    searches: int = 0
    matched: int = 0
    later_edition: int = 0
    disagreements: List[str] = field(default_factory=list)


def ours(pattern: str, subjects: Sequence[str]) -> object:
    """The ``InvalidPattern`` of a syntax error, ``"unsupported"``, or the search answers."""
    try:
        regex = compile_pattern(pattern)
    except UnsupportedPattern:
        return "unsupported"
    except InvalidPattern as error:
        return error
    return [regex.search(subject) for subject in subjects]


def theirs(node_path: str, patterns: List[str], subjects: List[List[str]]) -> Tuple[List[Answer], List[str]]:
    """Node's answers for one batch, from one ``node`` process, and which of ``LATER`` that Node has."""
    request = json.dumps({"patterns": patterns, "subjects": subjects})
    done = subprocess.run(
        [node_path, str(NODE_SCRIPT)], input=request.encode(), capture_output=True, timeout=600, check=True
    )
    reply = json.loads(done.stdout)
    return reply["answers"], reply["later"]


def compare(count: int, seed: int, node_path: str) -> Tally:
    generator = Generator(seed)
    tally = Tally()
    while tally.patterns < count:
        batch = [generator.pattern() for _ in range(min(BATCH, count - tally.patterns))]
        patterns = [_joined(text) for text, _ in batch]
        subjects = [generator.subjects(text, sample) for text, sample in batch]
        mine = [ours(pattern, texts) for pattern, texts in zip(patterns, subjects)]
        # Node only compiles what schemas.regex does not run: V8 backtracks, and "(a{0,99999})*" would take it minutes.
        asked = [texts if isinstance(answer, list) else [] for texts, answer in zip(subjects, mine)]
        answers, later = theirs(node_path, patterns, asked)
        for pattern, texts, answer, got in zip(patterns, asked, answers, mine):
            _judge(tally, pattern, texts, answer, got, [LATER[name] for name in later])
    return tally


def _judge(tally: Tally, pattern: str, subjects: List[str], answer: Answer, mine: object, later: List[str]) -> None:
    tally.patterns += 1
    if answer is None:
        tally.syntax_errors += 1
        if not isinstance(mine, InvalidPattern) or isinstance(mine, UnsupportedPattern):
            tally.disagreements.append(f"{pattern!r}: Node says SyntaxError, cache.schemas.regex says {mine!r}")
        return
    if mine == "unsupported":
        tally.unsupported += 1
        return
    if isinstance(mine, InvalidPattern):
        if any(words in str(mine) for words in later):
            tally.later_edition += 1
        else:
            tally.disagreements.append(f"{pattern!r}: Node compiles it, cache.schemas.regex says {mine}")
        return
    tally.searches += len(subjects)
    tally.matched += sum(answer)
    for subject, expected, got in zip(subjects, answer, mine):  # type: ignore[call-overload]
        if expected != got:
            tally.disagreements.append(f"{pattern!r} on {subject!r}: Node {expected}, cache.schemas.regex {got}")


def main(argv: List[str]) -> int:
    count = int(argv[1]) if len(argv) > 1 else 20_000
    seed = int(argv[2]) if len(argv) > 2 else 1
    node_path = node()
    if node_path is None:
        print("node is not on PATH", file=sys.stderr)
        return 2
    tally = compare(count, seed, node_path)
    print(
        f"{tally.patterns} patterns (seed {seed}): {tally.syntax_errors} SyntaxErrors in Node, "
        f"{tally.unsupported} valid but unsupported here, {tally.searches} searches compared "
        f"({tally.matched} matched), {tally.later_edition} of a later edition; "
        f"{len(tally.disagreements)} disagreements"
    )
    for line in tally.disagreements[:40]:
        print("  " + line)
    return 1 if tally.disagreements else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
