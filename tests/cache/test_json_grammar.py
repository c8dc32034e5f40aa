"""cache.json.grammar: exactly RFC 8259's grammar, and no laxer than the fast parser it stands behind."""

from __future__ import annotations

import json
import math
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from cache.json import grammar as json_grammar

SUITE = Path(__file__).resolve().parents[1] / "data" / "json_test_suite" / "test_parsing"


def grammar_accepts(data: bytes) -> bool:
    try:
        json_grammar.check(data.decode("utf-8"))
    except (UnicodeDecodeError, json_grammar.GrammarError):
        return False
    return True


def test_json_test_suite_verdicts():
    """Every y_ file of JSONTestSuite passes, every n_ file is refused (invalid UTF-8 counts as refused)."""
    files = sorted(SUITE.glob("[yn]_*.json"))
    assert len(files) > 280
    wrong = [path.name for path in files if grammar_accepts(path.read_bytes()) != path.name.startswith("y_")]
    assert wrong == []


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('{"a":"\\u 123"}', "invalid escape"),
        ('{"a":"\\u+123"}', "invalid escape"),
        ('{"a":"\\u1_23"}', "invalid escape"),
        ('{"a":"\\u-123"}', "invalid escape"),
        ('{"a":"\\uD\uff1800"}', "invalid escape"),
        ('{"a":"\\u12"}', "invalid escape"),
        ('{"a":1\u0661}', "expecting ',' or '}'"),
        ('{"a":1e\u0665}', "expecting ',' or '}'"),
        ('{"a":\u0661}', "expecting a value"),
        ('{"a":"x\ty"}', "control character U+0009"),
        ('{"a":"x', "unterminated string"),
        ('{"a":NaN}', "NaN is not a JSON value"),
        ('{"a":1}\u00a0', "extra data"),
        ('\u2028{"a":1}', "expecting a value"),
        ('{"a" 1}', "expecting ':'"),
        ("{a:1}", "expecting a member name"),
        ('{"a":1,}', "expecting a member name"),
        ("[1,]", "expecting a value"),
    ],
)
def test_refuses_what_a_lax_decoder_takes_and_says_where(text, what):
    with pytest.raises(json_grammar.GrammarError, match="^" + re.escape(what) + ".*char [0-9]+"):
        json_grammar.check(text)


def test_nesting_is_followed_without_recursion_and_refused_past_max_depth_at_once():
    depth = json_grammar.MAX_DEPTH
    json_grammar.check("[" * depth + "]" * depth)
    json_grammar.check('{"a":' * (depth - 1) + "{}" + "}" * (depth - 1))
    with pytest.raises(json_grammar.GrammarError, match="expecting a value"):
        json_grammar.check("[" * depth)
    started = time.perf_counter()
    for text in ("[" * (depth + 1) + "]" * (depth + 1), "[" * 1_000_000, '{"a":' * 500_000):
        with pytest.raises(json_grammar.TooDeep, match=f"nested deeper than {depth} levels"):
            json_grammar.check(text)
    assert time.perf_counter() - started < 0.5


def test_a_long_string_with_a_bad_escape_at_its_end_is_refused_quickly():
    """The string pattern is unrolled: a failed match does not backtrack."""
    text = '{"a":"' + "x\\n" * 300_000 + "\\q" + '"}'
    valid = '{"a":"' + "x\\n" * 300_000 + "\\t" + '"}'
    json_grammar.check(valid)  # warmed
    started = time.perf_counter()
    json_grammar.check(valid)
    once = time.perf_counter() - started
    started = time.perf_counter()
    with pytest.raises(json_grammar.GrammarError, match="invalid escape"):
        json_grammar.check(text)
    # Against the same string's success in the same moment, not the clock: a backtracking failure costs
    # hundreds of times a pass, and a loaded machine slows both alike.
    assert time.perf_counter() - started < 20 * once + 0.05


# Characters a lax parser might take where the grammar does not: other
# whitespace, other digits, signs and separators int() takes, escapes.
TRICKY = [
    *'0123456789-+._eEuUxX"\\/:,{}[] \t\n\r\f\vtfn',
    "\u00a0",
    "\u2028",
    "\u0661",
    "\u0665",
    "\uff18",
    "\x00",
    "\x1f",
    "\x7f",
    "\ufeff",
    "NaN",
    "Infinity",
    "\\u",
    "\\uD800",
    "\\ud83d\\ude00",
]
SEEDS = [
    '{"a":"x\\u00e9y","b":[1,-2.5e+3,0,true,false,null],"c":{"d":"\\n\\"\\\\\\/"}}',
    '{"n":-0.0,"m":1E-2,"s":"\\ud83d\\ude00","e":{},"l":[]}',
    '[1,[2,[3,{"k":"v"}]],"\\u0041"]',
]


def fast_parse(text: str) -> Any:
    """The interpreter's parser called without hooks: on PyPy the RPython one the codec trusts."""
    return json.loads(text)


def finite(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return True


def mutants(count: int):
    chooser = random.Random(44)
    for _ in range(count):
        text = chooser.choice(SEEDS)
        for _ in range(chooser.randint(1, 3)):
            at = chooser.randrange(len(text) + 1)
            cut = chooser.choice((0, 0, 1))
            text = text[:at] + chooser.choice(TRICKY) + text[at + cut :]
        yield text


def test_the_fast_parser_accepts_nothing_the_grammar_refuses():
    """Differential, 5,000 mutations of valid texts: what the codec keeps from the hookless parse
    (accepted, every number finite) the grammar accepts, and what the grammar accepts that parser reads."""
    kept_but_refused, read_but_refused = [], []
    for text in mutants(5_000):
        try:
            kept = finite(fast_parse(text))
        except ValueError:
            kept = None
        grammar = grammar_accepts(text.encode())
        if kept and not grammar:
            kept_but_refused.append(text)
        if grammar and kept is None:
            read_but_refused.append(text)
    assert kept_but_refused == []
    assert read_but_refused == []
