"""Fuzzed writes against a collection schema: nothing that breaks it is ever stored.

Hypothesis makes PUT bodies (members the schema names with values of the
right or a wrong type, and stray members) and merge patches over what was
stored; each goes through the real server. The server must accept exactly
what ``jsonschema`` accepts, and at the end every document in Redis is read
back and checked again with ``jsonschema`` (Jetway's verdict comes from its
own compiled closures; ``jsonschema`` only words the errors), with
Jetway's formats and with ``jsonschema``'s own.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import keys
from cache.schemas.schema import format_checker

SCHEMA: Dict[str, Any] = {
    "type": "object",
    "required": ["id", "name"],
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,10}$"},
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number", "exclusiveMinimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3, "uniqueItems": True},
        "active": {"type": "boolean"},
        "kind": {"enum": ["a", "b", 1]},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
        "created": {"type": "string", "format": "date-time"},
    },
    "patternProperties": {"^x-": {"type": "string"}},
}
EXAMPLES = 1000
OURS = jsonschema.Draft202012Validator(SCHEMA, format_checker=format_checker())
THEIRS = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 200),
    st.floats(-10, 200, allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "a", "ab-1", "Ab", "ada@example.com", "ada@", "12345", "1234", "2024-02-29T10:00:00Z"]),
    st.text(max_size=14),
)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


def mostly(valid: st.SearchStrategy, wrong: st.SearchStrategy = anything) -> st.SearchStrategy:
    """A valid value three times in four, else anything at all."""
    return st.integers(0, 3).flatmap(lambda pick: wrong if pick == 0 else valid)


near_valid = {
    "id": mostly(st.from_regex(r"\A[a-z][a-z0-9-]{0,10}\Z")),
    "name": mostly(st.text(min_size=1, max_size=12)),
    "email": mostly(st.sampled_from(["ada@example.com", "a.b@c.org"]), st.sampled_from(["no-at", "x@-y.com", 7])),
    "age": mostly(st.integers(0, 150), st.one_of(st.integers(-2, -1), st.just(151), st.just(3.5), anything)),
    "score": mostly(st.floats(0.5, 10), st.one_of(st.just(0), st.just(-1.5), anything)),
    "tags": mostly(st.lists(st.text(max_size=5), max_size=3, unique=True)),
    "active": mostly(st.booleans()),
    "kind": mostly(st.sampled_from(["a", "b", 1, 1.0]), st.sampled_from([True, "c", 2])),
    "address": mostly(
        st.just({"zip": "12345"}), st.sampled_from([{"zip": "1234"}, {"zip": 12345}, {"zip": "12345", "x": 1}])
    ),
    "created": mostly(st.just("2024-02-29T10:00:00Z"), st.sampled_from(["2023-02-29T10:00:00Z", "yesterday"])),
    "x-note": mostly(st.text(max_size=5)),
    "extra": anything,
}
required = {name: near_valid[name] for name in ("id", "name")}
optional = {name: value for name, value in near_valid.items() if name not in required}
documents = st.fixed_dictionaries(required, optional=optional)
# In a merge patch null removes a member: removing "name" breaks "required".
patches = st.fixed_dictionaries({}, optional={**optional, "name": mostly(near_valid["name"], st.none())})


@pytest.mark.slow  # 2,000 Hypothesis-made writes: ~25 s
def test_no_fuzzed_write_stores_a_document_that_breaks_the_schema(api, redis_client):
    body = json.dumps({"schema": SCHEMA}).encode()
    assert api.put_json("/v1/_collections/fuzzed", body).status_code == 201
    outcomes: List[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(document=documents, patch=patches, number=st.integers(0, 40))
    def write(document: Dict[str, Any], patch: Dict[str, Any], number: int) -> None:
        path = f"/v1/fuzzed/d{number}"
        put = api.put_json(path, json.dumps(document).encode())
        assert put.status_code in (200, 201, 422), put.text
        assert (put.status_code != 422) == OURS.is_valid(document), (document, put.text)
        outcomes.append("put stored" if put.status_code != 422 else "put refused")
        patched = api.patch_merge(path, json.dumps(patch).encode())
        assert patched.status_code in (200, 404, 422), patched.text
        outcomes.append({200: "patch stored", 404: "patch missing", 422: "patch refused"}[patched.status_code])
        if patched.status_code == 200:
            assert OURS.is_valid(patched.json()), patched.text

    write()
    counts = {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}
    print(f"\nfuzzed writes: {counts}")
    assert outcomes.count("put stored") + outcomes.count("put refused") >= 1000
    assert min(counts.get(kind, 0) for kind in ("put stored", "put refused", "patch stored", "patch refused")) >= 50

    stored = [key for key in redis_client.scan_iter(keys.PREFIX + b"{fuzzed:*:d:*")]
    assert stored, "some documents were stored"
    for key in stored:
        document = json.loads(redis_client.hget(key, "b"))
        assert not list(OURS.iter_errors(document)), (key, document)
        assert not list(THEIRS.iter_errors(document)), (key, document)
