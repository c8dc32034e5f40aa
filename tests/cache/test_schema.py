"""Collection schemas: Draft 2020-12 as the official test suite states it, through both validators.

The cases are the JSON-Schema-Test-Suite's (``tests/data/json_schema_test_suite``,
vendored with its license) for the keywords Jetway supports and the formats
it checks. Each case runs through the compiled closures (when the schema is
one they compile) and through ``jsonschema``, which writes the messages: the
two must agree with the suite, or the fast verdict could store what the
schema refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from cache.schemas.formats import CHECKED
from cache.schemas.schema import MAX_VIOLATIONS, CompiledSchema, InvalidSchema, Violation, compile_schema

SUITE = Path(__file__).resolve().parents[1] / "data" / "json_schema_test_suite"
# Python's re has no \\p{...}: such a schema is refused with a 422 saying so (docs/api.md, "Collection settings").
UNSUPPORTED = (
    "pattern with Unicode property escape requires unicode mode",
    "patternProperties with Unicode property escape",
)
# Punycode is checked for its syntax only (cache/schemas/formats.py).
NOT_CLAIMED = ("validation of A-label (punycode) host names",)


def suite_groups() -> List[Tuple[str, Any]]:
    groups = []
    for path in sorted(SUITE.rglob("*.json")):
        for group in json.loads(path.read_text()):
            if group["description"] not in NOT_CLAIMED:
                groups.append((f"{path.stem}: {group['description']}", group))
    return groups


GROUPS = suite_groups()


@pytest.mark.parametrize("name,group", GROUPS, ids=[name for name, _ in GROUPS])
def test_official_suite_case(name, group):
    if group["description"] in UNSUPPORTED:
        with pytest.raises(InvalidSchema, match="regex|regular expression"):
            compile_schema(group["schema"])
        return
    compiled = compile_schema(group["schema"])
    for case in group["tests"]:
        assert compiled.is_valid(case["data"]) == case["valid"], case["description"]
        assert (compiled.violations(case["data"]) == []) == case["valid"], case["description"]


def test_the_suite_is_there_and_mostly_compiled():
    compiled = [
        compile_schema(group["schema"]).compiled for name, group in GROUPS if group["description"] not in UNSUPPORTED
    ]
    assert len(compiled) > 200
    # The fast path is the point: most of the suite's schemas compile to closures.
    assert sum(compiled) / len(compiled) > 0.8


BENCH_SCHEMA = {
    "type": "object",
    "required": ["id", "email"],
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z0-9-]+$"},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "a/b": {"type": "string"},
    },
}


def test_violations_name_pointer_keyword_and_message():
    schema = compile_schema(BENCH_SCHEMA)
    assert schema.compiled
    found = schema.violations({"id": "Not Valid", "age": -1, "tags": ["x", 2], "a/b": 1})
    by_pointer = {violation.pointer: violation for violation in found}
    assert by_pointer["/id"].keyword == "pattern"
    assert by_pointer["/age"].keyword == "minimum"
    assert by_pointer["/tags/1"].keyword == "type"
    assert by_pointer["/a~1b"].keyword == "type"
    assert by_pointer[""].keyword == "required" and "'email'" in by_pointer[""].message
    assert schema.violations({"id": "ok", "email": "a@example.com"}) == []


def test_violations_are_capped():
    schema = compile_schema({"type": "array", "items": {"type": "string"}})
    found = schema.violations(list(range(100)))
    assert len(found) == MAX_VIOLATIONS
    assert all(isinstance(violation, Violation) for violation in found)


@pytest.mark.parametrize(
    "schema,why",
    [
        ({"type": "nope"}, "not a Draft 2020-12 schema"),
        ({"minLength": -1}, "not a Draft 2020-12 schema"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "Draft 2020-12"),
        ({"pattern": "("}, "regex|regular expression"),
        # With the u flag a malformed escape is an error, never another pattern (Annex B reads \x+1 as x+1).
        ({"pattern": "^\\x+1$"}, "malformed \\\\x escape"),
        ({"properties": {"a": {"pattern": "^\\u41"}}}, "malformed \\\\u escape"),
        ({"patternProperties": {"^\\c1$": {}}}, "\\\\c must be followed by a letter"),
        ([], "JSON object"),
    ],
)
def test_invalid_schemas_are_refused_saying_why(schema, why):
    with pytest.raises(InvalidSchema, match=why):
        compile_schema(schema)


def test_unknown_keywords_go_to_jsonschema_and_still_decide():
    schema = compile_schema({"type": "object", "unevaluatedProperties": False, "properties": {"a": {}}})
    assert not schema.compiled
    assert schema.is_valid({"a": 1}) and not schema.is_valid({"a": 1, "b": 2})


@pytest.mark.parametrize(
    "name,good,bad",
    [
        ("date-time", "2024-02-29T23:59:60Z", "2023-02-29T10:00:00Z"),
        ("date", "2024-02-29", "2024-2-29"),
        ("time", "23:59:60Z", "12:00:00"),
        ("email", "ada@example.com", "ada@"),
        ("uri", "https://example.com/a?b#c", "/relative"),
        ("uuid", "2eb8aa08-aa98-11ea-b4aa-73b441d16380", "2eb8aa08aa98"),
        ("ipv4", "192.168.0.1", "192.168.0.01"),
        ("ipv6", "::1", "::1%eth0"),
        ("hostname", "api.example.com", "-api.example.com"),
    ],
)
def test_each_checked_format(name, good, bad):
    schema: CompiledSchema = compile_schema({"format": name})
    assert schema.is_valid(good) and not schema.is_valid(bad)
    assert schema.is_valid(12), "a format says nothing about other types"
    assert name in CHECKED


def test_other_formats_are_annotations():
    assert compile_schema({"format": "iri"}).is_valid("not an iri at all")


def test_a_worker_imports_jsonschema_only_when_a_schema_is_compiled():
    # A worker whose collections have no schema never loads jsonschema (~5 MB of its resident memory).
    probe = (
        "import sys, api.worker, api.app, handlers.collection_settings\n"
        "before = 'jsonschema' in sys.modules\n"
        "from cache.schemas.schema import compile_schema\n"
        "compile_schema({'type': 'object'})\n"
        "print(before, 'jsonschema' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    shown = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True, timeout=60
    )
    assert shown.stdout.split() == ["False", "True"]
