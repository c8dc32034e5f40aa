"""cache.regex: ECMA-262 patterns matched in linear time, agreeing with Python's re where the two languages agree."""

from __future__ import annotations

import re
import time

import pytest

from cache.regex import MAX_PATTERN_CHARS, InvalidPattern, compile_pattern

PATTERNS = [
    "^(a+)+$", "a+", "^a*$", "^[a-z0-9-]{3,40}$", r"^\+[0-9 ]{6,20}$", "f.o", "^v", "^á", r"\bfoo\b", r"\Bo",
    "a|b|c$", "(ab|cd)*e", "", "x{2,}y", "[^abc]+$", r"\d\w\s", "colou?r", "^$", "a{3}", "(a|)+b", "a+?b", "(?:x|y)z",
    r"[\]\-]", r"\x41\u0042",
]  # fmt: skip
TEXTS = [
    "", "a", "aaaa!", "aaa", "user-0001", "+44 20 7946 0000", "foo", "fxo", "vv", "áb", "a foo b", "xfoox", "b",
    "ababcde", "xxy", "xy", "dd", "1a ", "color", "colour", "-", "]", "AB", "qr", "yz", "aab",
]  # fmt: skip


@pytest.mark.parametrize("pattern", PATTERNS)
def test_search_agrees_with_python_re_on_ordinary_patterns(pattern):
    mine, theirs = compile_pattern(pattern), re.compile(pattern, re.ASCII)
    for text in TEXTS:
        assert mine.search(text) == (theirs.search(text) is not None), text


def test_ecma_semantics_where_python_differs():
    assert not compile_pattern("a$").search("a\n"), "ECMA's $ is the end of the input, not before a final newline"
    assert not compile_pattern(r"^\d$").search("\u0663"), "\\d is ASCII digits"
    assert compile_pattern(r"^\s$").search("\u3000"), "\\s is ECMA's WhiteSpace"
    assert not compile_pattern("^.$").search("\u2028"), ". stops at every line terminator"
    assert compile_pattern("^(?<name>q)r$").search("qr"), "ECMA's named group (Python writes (?P<name>...))"
    assert compile_pattern("^a{,2}$").search("a{,2}"), "{,2} is no quantifier in ECMA-262 (Python reads {0,2})"
    assert compile_pattern(r"[\d-z]").search("-") and not compile_pattern(r"[\d-z]").search("m"), "Annex B"


def test_catastrophic_patterns_run_in_linear_time():
    regex = compile_pattern("^(a+)+$")
    started = time.perf_counter()
    assert not regex.search("a" * 100_000 + "!")
    assert regex.search("a" * 100_000)
    assert time.perf_counter() - started < 2.0


def test_the_cost_is_charged():
    spent = []
    compile_pattern("b").search("a" * 400, spent.append)
    assert sum(spent) >= 100


@pytest.mark.parametrize(
    "pattern,words",
    [
        (r"(a)\1", "backreferences"),
        (r"\k<x>", "backreferences"),
        ("(?=a)", "lookaround"),
        ("(?<!a)b", "lookaround"),
        (r"\p{Letter}", "Unicode property escapes"),
        ("(a{100}){100}", "more than 4000 states"),
        ("a{2}{3}", "nothing to repeat"),
        ("a**", "nothing to repeat"),
        ("(", "missing ')'"),
        ("[a", "missing ']'"),
        ("(" * 40 + ")" * 40, "nested deeper"),
        ("x" * (MAX_PATTERN_CHARS + 1), "the limit is"),
    ],
)
def test_what_the_engine_refuses_and_why(pattern, words):
    with pytest.raises(InvalidPattern, match=re.escape(words)):
        compile_pattern(pattern)


def test_the_transition_cache_is_bounded():
    regex = compile_pattern("z")
    regex.search("".join(chr(0x4E00 + i) for i in range(30_000)))
    assert regex.cached <= 20_000
