"""Typing a query's values from the collection's JSON Schema: the walk to the member, and the patterns."""

from __future__ import annotations

import re

from handlers.openapi.member_schemas import member_schema, value_pattern

SCHEMA = {
    "$defs": {
        "customer": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}},
        "loop": {"$ref": "#/$defs/loop"},
    },
    "type": "object",
    "properties": {
        "email": {"type": "string", "format": "email", "maxLength": 254, "title": "not a value keyword"},
        "customer": {"$ref": "#/$defs/customer"},
        "age": {"type": "integer", "minimum": 0},
        "tier": {"enum": ["gold", "silver", 3, True]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "pair": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "boolean"}]},
        "looping": {"$ref": "#/$defs/loop"},
        "elsewhere": {"$ref": "https://example.com/schema.json"},
    },
    "allOf": [{"properties": {"late": {"const": "x.y"}}}],
}


def test_the_walk_follows_properties_refs_items_and_all_of() -> None:
    assert member_schema(SCHEMA, ["email"]) == {"type": "string", "format": "email", "maxLength": 254}
    assert member_schema(SCHEMA, ["customer", "id"]) == {"type": "string", "format": "uuid"}
    assert member_schema(SCHEMA, ["tags", "7"]) == {"type": "string"}
    assert member_schema(SCHEMA, ["pair", "1"]) == {"type": "boolean"}
    assert member_schema(SCHEMA, ["late"]) == {"const": "x.y"}


def test_what_the_schema_does_not_say_types_nothing() -> None:
    assert member_schema(SCHEMA, ["missing"]) is None
    assert member_schema(SCHEMA, ["tags", "07"]) is None  # not an array index in a JSON Pointer
    assert member_schema(SCHEMA, ["looping", "x"]) is None  # a $ref loop ends, untyped
    assert member_schema(SCHEMA, ["elsewhere"]) is None  # a remote $ref is not fetched
    assert member_schema(True, ["email"]) is None
    assert member_schema(SCHEMA, ["customer"]) == {"type": "object"}


def test_patterns_take_what_a_query_of_that_type_accepts() -> None:
    number = re.compile(value_pattern("number", None))
    assert all(number.match(v) for v in ("eq.1", "gte.-2.5", "lt.1e3"))
    assert not any(number.match(v) for v in ("eq.01", "eq.abc", "like.1", "eq.1."))
    integer = re.compile(value_pattern("number", member_schema(SCHEMA, ["age"])))
    assert integer.match("gt.18") and not integer.match("gt.18.5")
    boolean = re.compile(value_pattern("boolean", None))
    assert boolean.match("eq.true") and not boolean.match("gt.true") and not boolean.match("eq.1")
    tier = re.compile(value_pattern("string", member_schema(SCHEMA, ["tier"])))
    assert tier.match("eq.gold") and tier.match("lt.silver") and not tier.match("eq.bronze")
    assert not tier.match("eq.3")  # the enum's number is not a string field's value
    late = re.compile(value_pattern("string", member_schema(SCHEMA, ["late"])))
    assert late.match("eq.x.y") and not late.match("eq.xzy")  # the enum's text is escaped
    assert re.compile(value_pattern("string", None)).match("eq.anything at all")


def test_patterns_take_an_in_of_values_of_that_type() -> None:
    number = re.compile(value_pattern("number", None))
    assert number.match("in.(1,-2.5,1e3)") and not number.match("in.(1,x)") and not number.match("in.()")
    assert number.match("in.(" + ",".join(["1"] * 20) + ")") and not number.match("in.(" + ",".join(["1"] * 21) + ")")
    boolean = re.compile(value_pattern("boolean", None))
    assert boolean.match("in.(true,false)") and not boolean.match("in.(yes)")
    tier = re.compile(value_pattern("string", member_schema(SCHEMA, ["tier"])))
    assert tier.match("in.(gold,silver)") and tier.match('in.("gold")') and not tier.match("in.(gold,bronze)")
    odd = re.compile(value_pattern("string", {"enum": ["a,b", 'say "hi"']}))
    assert odd.match('in.("a,b","say \\"hi\\"")') and not odd.match("in.(a,b)")
    assert re.compile(value_pattern("string", None)).match('in.(anything,"at all")')


def test_patterns_take_a_prefix_on_a_string_field_only() -> None:
    string = re.compile(value_pattern("string", None))
    assert string.match("like.ann*") and string.match("like.*")
    assert not any(string.match(v) for v in ("like.ann", "like.a*b*", "like.a%*", "like.*a"))
    tier = re.compile(value_pattern("string", member_schema(SCHEMA, ["tier"])))
    assert tier.match("like.go*") and not tier.match("like.go")
    assert not re.compile(value_pattern("number", None)).match("like.1*")
