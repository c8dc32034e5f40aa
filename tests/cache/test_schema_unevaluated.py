"""cache.schemas.unevaluated: unevaluatedProperties beside patternProperties, as jsonschema judges it, in linear time.

The reference is ``jsonschema``'s own validator (which matches with
``re``) on patterns where ``re`` is harmless; the hostile pattern shows
the difference: ``re`` backtracks, ``cache.schemas.regex`` does not.
"""

from __future__ import annotations

import time

import jsonschema
import pytest

from cache.schemas.schema import ValidationRefused, compile_schema

SCHEMAS = [
    {"patternProperties": {"^foo": {"type": "string"}}, "unevaluatedProperties": False},
    {
        "properties": {"foo": {}},
        "allOf": [{"patternProperties": {"^bar": {"type": "string"}}}],
        "unevaluatedProperties": False,
    },
    {
        "anyOf": [{"patternProperties": {"^a": {}}}, {"patternProperties": {"^b": {"const": 1}}}],
        "unevaluatedProperties": False,
    },
    {
        "$defs": {"x": {"patternProperties": {"x$": {}}}},
        "$ref": "#/$defs/x",
        "unevaluatedProperties": {"type": "integer"},
    },
    {
        "if": {"patternProperties": {"^i": {"type": "string"}}},
        "then": {"patternProperties": {"^t": {}}},
        "else": {"patternProperties": {"^e": {}}},
        "unevaluatedProperties": False,
    },
    {
        "dependentSchemas": {"d": {"patternProperties": {"^dd": {}}}},
        "properties": {"d": {}},
        "unevaluatedProperties": False,
    },
    {
        "patternProperties": {"^n": {"patternProperties": {"^m": {}}, "unevaluatedProperties": False}},
        "unevaluatedProperties": False,
    },
    {
        "oneOf": [{"patternProperties": {"^o": {"type": "string"}}, "required": ["o1"]}, {"required": ["p"]}],
        "unevaluatedProperties": False,
    },
]
DOCUMENTS = [
    {},
    {"foo": "s"},
    {"foo": 1},
    {"foo": "s", "bar": "s"},
    {"bar": 1, "baz": 2},
    {"a1": 1, "b1": 1},
    {"b1": 2},
    {"xx": 1, "y": 2},
    {"y": 2},
    {"i": "s", "t": 1},
    {"i": 1, "e": 1},
    {"i": "s", "e": 1},
    {"d": 1, "dd": 2},
    {"dd": 2},
    {"n": {"m": 1}},
    {"n": {"q": 1}},
    {"o1": "s", "o2": "t"},
    {"o1": 1, "p": 1},
    {"p": 1, "o2": "s"},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=[str(n) for n in range(len(SCHEMAS))])
def test_the_verdict_and_the_errors_are_jsonschemas_own(schema):
    compiled = compile_schema(schema)
    reference = jsonschema.Draft202012Validator(schema)
    assert not compiled.compiled, "unevaluatedProperties is jsonschema's to judge"
    for document in DOCUMENTS:
        expected = reference.is_valid(document)
        assert compiled.is_valid(document) == expected, document
        messages = [violation.message for violation in compiled.violations(document)]
        assert messages == [error.message for error in reference.iter_errors(document)][: len(messages)], document


def test_a_backtracking_pattern_beside_unevaluated_properties_costs_linear_time():
    schema = {"patternProperties": {"^(a+)+$": {}}, "unevaluatedProperties": False}
    compiled = compile_schema(schema)
    name = "a" * 5000 + "!"
    started = time.monotonic()
    try:
        verdict = compiled.is_valid({name: 1})
    except ValidationRefused:
        verdict = False  # the budget may stop it: refused either way, and quickly
    assert verdict is False and time.monotonic() - started < 1.0
    assert compiled.is_valid({"aaaa": 1})
