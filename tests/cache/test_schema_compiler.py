"""cache.schemas.compiler: which schemas compile to closures, what the closures decide, what they charge.

The official suite runs through the closures in ``tests/cache/test_schema.py``;
these pin the compiler's own rules.
"""

from __future__ import annotations

import pytest

from cache.schemas.bounds import check_cost
from cache.schemas.budget import CHECK_EVERY, Exhausted, Meter
from cache.schemas.compiler import compilable, compile_closures, json_equal, uses
from cache.schemas.schema import compile_schema


def closures(schema, meter=None):
    return compile_closures(schema, check_cost(schema), meter or Meter())


def test_integer_and_equality_follow_json_not_python():
    integer = compile_schema({"type": "integer"})
    assert integer.is_valid(1.0) and not integer.is_valid(True) and not integer.is_valid(1.5)
    assert json_equal(1, 1.0) and not json_equal(True, 1) and not json_equal([0], [False])
    assert not compile_schema({"enum": [1]}).is_valid(True)


def test_only_known_keywords_and_local_refs_compile():
    assert compilable({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {}}})
    assert compilable(True) and compilable({})
    assert not compilable({"unevaluatedProperties": False})
    assert not compilable({"properties": {"a": {"$dynamicRef": "#x"}}})
    assert not compilable({"$ref": "other.json#/a"}), "a $ref by $id is jsonschema's to resolve"


def test_uses_looks_at_every_depth_defs_included():
    schema = {"$defs": {"x": {"items": {"uniqueItems": True}}}}
    assert uses(schema, ("uniqueItems",)) and not uses(schema, ("enum",))


def test_a_recursive_schema_compiles_once_and_follows_the_document():
    schema = {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["name"]}
    check = closures(schema)
    assert check({"name": 1, "child": {"name": 2, "child": {"name": 3}}})
    assert not check({"name": 1, "child": {"child": {}}})


def test_patterns_are_searched_not_anchored_and_name_members():
    check = closures({"patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False})
    assert check({"x-a": "s"}) and not check({"x-a": 1}) and not check({"y": "s"})
    assert closures({"pattern": "b"})("abc")


def test_nodes_that_apply_subschemas_charge_the_meter_until_it_stops():
    meter = Meter(steps=CHECK_EVERY * 2)
    check = closures({"items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, meter)
    meter.start()
    assert check(list(range(100)))
    meter.start()
    with pytest.raises(Exhausted):
        check(list(range(CHECK_EVERY * 4)))


def test_multiple_of_with_a_float_divisor_is_exact_past_overflow():
    check = closures({"multipleOf": 0.5})
    assert check(1.5) and not check(1.25)
    assert not closures({"multipleOf": 0.123456789})(1e308)
