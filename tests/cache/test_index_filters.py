"""cache.indexes.filters: which arguments are filters, and ``in``'s lists as PostgREST writes them."""

from __future__ import annotations

from typing import List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache.indexes.filters import MAX_IN_VALUES, QueryError, in_list


def written(values: List[str]) -> str:
    """A list as a client writes it: each value in double quotes, ``\\`` and ``"`` escaped."""
    return "(" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + ")"


@pytest.mark.parametrize(
    ("raw", "values"),
    [
        ("(a,b,c)", ["a", "b", "c"]),
        ("(a)", ["a"]),
        ('("a,b",c)', ["a,b", "c"]),
        ('("(x)","say \\"hi\\"","back\\\\slash")', ["(x)", 'say "hi"', "back\\slash"]),
        ('("")', [""]),
        ("(a,)", ["a", ""]),
        ("(a b, c)", ["a b", " c"]),  # spaces are the values' own
        ("(é,\\)", ["é", "\\"]),  # unquoted, a backslash is itself
    ],
)
def test_in_lists_read_as_postgrest_writes_them(raw: str, values: List[str]) -> None:
    assert in_list("f", raw) == values


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("()", "1 to 20 values"),
        ("a,b", "1 to 20 values"),
        ("(a,b", "1 to 20 values"),
        ('("a,b)', "a quoted value ends with a quote"),
        ('("a"b)', "a quoted value ends with a quote"),
        ('(a"b)', "quote it"),
        ("(a(b)", "quote it"),
        ("(" + ",".join(["v"] * (MAX_IN_VALUES + 1)) + ")", f"more than {MAX_IN_VALUES} values"),
    ],
)
def test_in_lists_that_cannot_be_read_are_refused_naming_the_syntax(raw: str, says: str) -> None:
    with pytest.raises(QueryError, match=says.replace("(", r"\(").replace(")", r"\)")):
        in_list("f", raw)


@given(st.lists(st.text(max_size=6), min_size=1, max_size=MAX_IN_VALUES))
def test_any_values_quoted_are_read_back(values: List[str]) -> None:
    assert in_list("f", written(values)) == values


def test_like_takes_a_string_fields_prefix_and_one_trailing_star() -> None:
    from cache.indexes.declared import declared_indexes
    from cache.indexes.filters import parse

    (index,) = declared_indexes({"i": {"fields": [{"name": "name", "pointer": "/name", "type": "string"}]}})
    field = index.fields[0]
    assert parse(field, "like", "ann*").values == ("ann",)
    assert parse(field, "like", "*").values == ("",)  # every string
    for refused in ("ann", "a*n*", "*ann", "an%*", "a%", ""):
        with pytest.raises(QueryError, match=r"name=like\.abc\* \(a prefix, then one \* at the end"):
            parse(field, "like", refused)
