"""cache.schemas.budget and cache.schemas.bounds: the work a document may cost, and what a schema may be."""

from __future__ import annotations

import pytest

from cache.schemas.bounds import json_depth
from cache.schemas.budget import Exhausted, Meter, canonical, more_values_than, unique
from cache.schemas.schema import InvalidSchema, ValidationRefused, compile_schema


def test_the_meter_stops_at_its_steps_and_at_its_clock():
    meter = Meter(steps=10_000, seconds=100)
    with pytest.raises(Exhausted):
        for _ in range(20_000):
            meter.charge(1)
    now = [0.0]
    slow = Meter(steps=10**9, seconds=0.04, clock=lambda: now[0])
    slow.charge(100)
    now[0] = 1.0
    with pytest.raises(Exhausted):
        for _ in range(5000):
            slow.charge(1)


def test_unique_is_json_equality_in_one_pass():
    def free(units):
        return None

    assert not unique([1, 1.0], free) and unique([1, True], free)
    assert not unique([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}], free)
    assert canonical([0], free) != canonical([False], free)


def test_depth_and_size_walks_need_no_recursion():
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep, 200) == 201
    assert more_values_than(list(range(10)), 5) and not more_values_than([1], 5)


def test_a_schema_refused_names_the_limit():
    with pytest.raises(InvalidSchema, match="does not point inside the schema"):
        compile_schema({"$ref": "https://example.com/a.json"})
    with pytest.raises(InvalidSchema, match="cycle"):
        compile_schema(
            {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
        )


def test_refs_inside_the_schema_by_id_and_anchor_and_the_shipped_meta_schema_are_kept():
    schema = compile_schema(
        {
            "$id": "https://example.com/root.json",
            "$defs": {"item": {"$id": "item.json", "type": "integer"}, "named": {"$anchor": "n", "minimum": 0}},
            "properties": {"a": {"$ref": "item.json"}, "b": {"$ref": "#n"}},
        }
    )
    assert schema.is_valid({"a": 1, "b": 2}) and not schema.is_valid({"a": "x"}) and not schema.is_valid({"b": -1})
    meta = compile_schema({"$ref": "https://json-schema.org/draft/2020-12/schema"})
    assert meta.is_valid({"type": "object"}) and not meta.is_valid({"type": 12})


def test_a_recursive_schema_refuses_a_document_deeper_than_the_bound_with_a_4xx_error():
    tree = compile_schema({"type": "object", "properties": {"c": {"$ref": "#"}}})
    document: object = {}
    for _ in range(400):
        document = {"c": document}
    with pytest.raises(ValidationRefused) as refused:
        tree.is_valid(document)
    assert refused.value.violations[0].keyword == "maxDepth"


def test_messages_for_a_large_document_are_one_plain_violation():
    schema = compile_schema({"items": {"type": "string"}})
    found = schema.violations(list(range(10_000)))
    assert len(found) == 1 and "at most" in found[0].message
