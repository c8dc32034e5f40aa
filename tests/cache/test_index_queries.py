"""cache.indexes.queries' planning, held to Python's own filtering over generated documents and queries.

No Redis here: the entries are made by ``cache.indexes.values`` (which the
scripts' Lua is held to in ``tests/cache/test_index_scripts.py``) and the
planned range is applied as ``ZRANGEBYLEX`` applies it, to bytes. Every
generated query must select exactly the documents Python's comparison
selects, in the index's order: a bound off by one byte (a value that is a
prefix of another, a number whose encoding starts with 0xFF) shows here.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.indexes.declared import declared_indexes
from cache.indexes.queries import NoIndex, QueryError, plan
from cache.indexes.values import EXACT_INTEGERS, entry

INDEXES = declared_indexes(
    {
        "by_name": {"fields": [{"name": "name", "pointer": "/name", "type": "string"}]},
        "by_team_score": {
            "fields": [
                {"name": "team", "pointer": "/team", "type": "string"},
                {"name": "score", "pointer": "/score", "type": "number"},
            ]
        },
        "by_score": {"fields": [{"name": "score", "pointer": "/score", "type": "number"}]},
    }
)
names = st.text(alphabet="ab\x00é", max_size=3)
scores = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([0.5, -0.5, 1e15, -1e15, 2.0**52, -(2.0**52)]),
)
documents = st.dictionaries(
    st.text(alphabet="abcdef0123", min_size=1, max_size=4),
    st.fixed_dictionaries({"name": names, "team": st.sampled_from(["x", "xy", "y"]), "score": scores}),
    max_size=25,
)


def in_range(member: bytes, low: bytes, high: bytes) -> bool:
    """``ZRANGEBYLEX``'s test of one member against its bounds."""
    if low != b"-" and (low == b"+" or (member < low[1:] if low[:1] == b"[" else member <= low[1:])):
        return False
    return high == b"+" or (high != b"-" and (member <= high[1:] if high[:1] == b"[" else member < high[1:]))


def answered(docs: Dict[str, Any], arguments: Dict[str, List[str]]) -> List[str]:
    query = plan(INDEXES, arguments, 1000, None)
    fields = [(field.tokens, field.type) for field in query.index.fields]
    entries = sorted(
        (made, doc_id) for doc_id, doc in docs.items() if (made := entry(doc, fields, doc_id.encode())) is not None
    )
    low, high = query.bounds()
    found = [doc_id for made, doc_id in entries if in_range(made, low, high)]
    return found[::-1] if query.descending else found


def _python(value: Any, operator: str, given: Any) -> bool:
    return {"eq": value == given, "gt": value > given, "gte": value >= given, "lt": value < given,
            "lte": value <= given}[operator]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    documents,
    st.sampled_from(["name", "team+score", "score"]),
    st.sampled_from(["eq", "gt", "gte", "lt", "lte"]),
    st.one_of(st.none(), st.sampled_from(["gt", "gte", "lt", "lte"])),
    names,
    scores,
    st.booleans(),
)
def test_a_planned_range_selects_what_python_selects(
    docs: Dict[str, Any], which: str, operator: str, second: Optional[str], name: str, score: Any, descending: bool
) -> None:
    if which == "name":
        arguments = {"name": [f"{operator}.{name}"]}
        keep = [d for d, doc in docs.items() if _python(doc["name"], operator, name)]
        # The index's order: the name's UTF-8 bytes (its code points), then the id.
        wanted = sorted(keep, key=lambda d: (docs[d]["name"].encode(), d.encode()))
    else:
        filters = [f"{operator}.{score!r}"]
        keep = [d for d, doc in docs.items() if _python(doc["score"], operator, score)]
        if second is not None and operator != "eq" and (second in ("gt", "gte")) != (operator in ("gt", "gte")):
            filters.append(f"{second}.{score + 1!r}")
            keep = [d for d in keep if _python(docs[d]["score"], second, score + 1)]
        arguments = {"score": filters, "order": [f"score.{'desc' if descending else 'asc'}"]}
        if which == "team+score":
            arguments["team"] = ["eq.x"]
            keep = [d for d in keep if docs[d]["team"] == "x"]
        wanted = sorted(keep, key=lambda d: (float(docs[d]["score"]), d.encode()), reverse=descending)
    assert answered(docs, arguments) == wanted


@settings(max_examples=300, deadline=None)
@given(documents, names, st.booleans())
def test_a_prefix_selects_the_strings_that_start_with_it(docs: Dict[str, Any], start: str, descending: bool) -> None:
    """``like.<text>*`` over names of NUL, é and letters: exactly the names that start with the text, in order."""
    arguments = {"name": [f"like.{start}*"], "order": [f"name.{'desc' if descending else 'asc'}"]}
    keep = [d for d, doc in docs.items() if doc["name"].startswith(start)]
    wanted = sorted(keep, key=lambda d: (docs[d]["name"].encode(), d.encode()), reverse=descending)
    assert answered(docs, arguments) == wanted


def test_an_in_is_a_range_per_distinct_value_in_the_index_order() -> None:
    """Values of one encoding (1, 1.0, -0, 0) are one range; the ranges are in the index's order whatever the
    list's; each range's lead is its value's prefix, unless the order is on the in's field."""
    query = plan(INDEXES, {"score": ["in.(2,1,1.0,-0,0)"]}, 10, None)
    assert query.index.name == "by_score" and len(query.ranges) == 3
    assert [r.low for r in query.ranges] == sorted(r.low for r in query.ranges)
    assert all(r.low == b"[" + r.lead for r in query.ranges)
    ordered = plan(INDEXES, {"score": ["in.(2,1)"], "order": ["score.desc"]}, 10, None)
    assert [r.lead for r in ordered.ranges] == [b"", b""] and ordered.descending
    merged = plan(INDEXES, {"team": ['in.(x,"x")'], "score": ["gt.1"]}, 10, None)
    assert merged.index.name == "by_team_score" and len(merged.ranges) == 1


def test_the_smallest_index_that_fits_answers() -> None:
    assert plan(INDEXES, {"score": ["gt.1"]}, 10, None).index.name == "by_score"
    assert plan(INDEXES, {"team": ["eq.x"], "score": ["gt.1"]}, 10, None).index.name == "by_team_score"
    assert plan(INDEXES, {"team": ["eq.x"]}, 10, None).index.name == "by_team_score"


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"age": ["eq.1"]}, NoIndex, '"by_age"'),
        ({"name": ["eq.a"], "score": ["gt.1"]}, NoIndex, "by_name_score"),
        ({"score": ["gt.x"]}, QueryError, "not a JSON number"),
        ({"score": ["gt.1", "gte.2"]}, QueryError, "two lower bounds"),
        ({"score": ["eq.1", "eq.2"]}, QueryError, "two values"),
        ({"score": ["gt.1"], "name": ["gt.a"]}, QueryError, "one field at a time"),
        ({"score": ["gt.1"], "order": ["name.asc"]}, QueryError, "must be on the ranged field"),
        ({"score": [f"eq.{EXACT_INTEGERS}"]}, QueryError, "2**53"),
        ({"score": ["eq.1e999"]}, QueryError, "2**53"),
        ({"order": ["nothing.desc"]}, QueryError, "not a field"),
        ({"score": ["about.1"]}, QueryError, "op.value"),
        ({"score": ["5"]}, QueryError, "op one of eq, gt, gte, lt, lte"),
        ({"age": ["neq.1"]}, QueryError, "op one of"),  # an unknown operator, whatever the field
        ({"team": ["in.(" + ",".join(f"v{n}" for n in range(21)) + ")"]}, QueryError, "more than 20 values"),
        ({"team": ["in.()"]}, QueryError, "1 to 20 values"),
        ({"score": ["in.(1,x)"]}, QueryError, "not a JSON number"),
        ({"team": ["in.(x)", "eq.x"]}, QueryError, "eq and in"),
        ({"team": ["in.(x)", "in.(y)"]}, QueryError, "two in lists"),
        ({"team": ["in.(x)"], "name": ["in.(a)"]}, QueryError, "in on one field at a time"),
        ({"score": ["in.(1)", "gt.0"]}, QueryError, "score has in and a range"),
        ({"team": ["in.(x,y)"], "name": ["gt.a"]}, NoIndex, "by_team_name"),
        ({"name": ["like.a"]}, QueryError, "like takes a prefix only: name=like.abc*"),
        ({"name": ["like.*a"]}, QueryError, "like takes a prefix only"),
        ({"name": ["like.a*b*"]}, QueryError, "like takes a prefix only"),
        ({"name": ["like.a%"]}, QueryError, "no %"),
        ({"name": ["like.a%*"]}, QueryError, "no %"),
        ({"score": ["like.1*"]}, QueryError, "like is for string fields"),
        ({"name": ["like.a*", "lt.b"]}, QueryError, "like is a range of its own"),
        ({"name": ["gt.a", "like.a*"]}, QueryError, "like is a range of its own"),
        ({"name": ["like.a*"], "order": ["score.asc"]}, QueryError, "must be on the ranged field"),
    ],
)
def test_queries_that_cannot_be_asked(arguments: Dict[str, List[str]], error: type, says: str) -> None:
    with pytest.raises(error, match=says.replace("*", r"\*").replace(".", r"\.")):
        plan(INDEXES, arguments, 10, None)


def test_what_is_taken_for_a_filter() -> None:
    """Named like a declared field, or valued like ``op.value`` (any lowercase word): a filter, which ``plan``
    refuses if it cannot apply it; the operation's own parameters and anything else (``_=...``) are not."""
    from cache.indexes.filters import field_names, filters_of

    fields = field_names(INDEXES)
    assert fields == {"name", "team", "score"}
    arguments = {
        "name": ["Ann"],  # a declared field, not op.value: a filter (refused)
        "x": ["neq.1"],  # looks like op.value: a filter (refused: the operator)
        "y": ["gt.1"],  # known operator, no such field: a filter (no-index)
        "_": ["1700000000.5"],
        "utm": ["Spring.sale"],
        "limit": ["gt.5"],  # the operation's own
        "order": ["score.desc"],
    }
    assert filters_of(arguments, fields, {"limit"}) == {
        "name": ["Ann"],
        "x": ["neq.1"],
        "y": ["gt.1"],
        "order": ["score.desc"],
    }


def test_a_page_goes_on_after_a_shard_that_looked_past_stale_entries_only() -> None:
    """One shard stopped at c after stale entries (no body), another gave d: the page ends at c, empty,
    and its cursor goes on after c (not a failure, and not d before what the first shard had left)."""
    from cache.indexes.reads import _merged

    query = plan(INDEXES, {"name": ["gte.a"]}, 10, None)
    outcomes = [(True, [b"cut", b"c"]), (True, [b"end", b"", b"d", b"{}", 2])] + [(True, [b"end", b""])] * 14
    found = _merged(outcomes, query, [0] * 16, 10, 1 << 20)
    assert (found.bodies, found.last, found.oversize) == ([], b"c", None)
    # A shard whose first entry was over its share: that entry alone, next.
    outcomes = [(True, [b"more", b"b", b"b", None, 5000])] + [(True, [b"end", b"", b"d", b"{}", 2])] * 15
    found = _merged(outcomes, query, [0] * 16, 10, 1 << 20)
    assert (found.bodies, found.oversize) == ([], b"b")
