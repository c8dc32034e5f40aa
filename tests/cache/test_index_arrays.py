"""Array fields (multi-entry indexes) on the suite's real redis-server: entries, builds, sweeps and cs queries.

Generated documents whose ``tags`` (``string[]``) and ``nums`` (``number[]``)
hold duplicates, elements of other types, or are not arrays at all are
written, rewritten and deleted by the store's PUT and DELETE scripts (Redis
making the entries, or taking the worker's ``index_args``), some before the
indexes are declared and then built; after each step every index's sorted
set is exactly the model's entries, each document's field is Python's
packed entries, and every ``cs`` query read page after page by
``reads.run`` is the model's answer, each document once.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.python.failure import Failure

from cache import keys
from cache.documents import scripts
from cache.indexes import reads
from cache.indexes.declared import declared_indexes, index_args, spec_json
from cache.indexes.queries import plan
from cache.indexes.scripts import BUILD, SPEC, SWEEP
from cache.indexes.values import MAX_ARRAY_ENTRIES, encode, entry, unpack_entries
from tests.cache.test_index_reads import ScriptLink, is_number

COLL = b"ar"
INDEXES = declared_indexes(
    {
        "by_tags": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string[]"}]},
        "by_team_nums": {
            "fields": [
                {"name": "team", "pointer": "/team", "type": "string"},
                {"name": "nums", "pointer": "/nums", "type": "number[]"},
                {"name": "score", "pointer": "/score", "type": "number"},
            ]
        },
    }
)
TAGS = ["red", "re", "", "a,b", '{"}', "é\x00"]
NUMS = [-1, 0, -0.0, 1, 1.0, 2.5, 1e15]
elements = st.one_of(st.sampled_from(TAGS), st.sampled_from(NUMS), st.none(), st.just(True), st.just([1]))
arrays = st.one_of(
    st.lists(elements, max_size=6),
    st.sampled_from(["red", 3, {"0": "red"}, {}, None]),  # not arrays: no entries
)
documents = st.fixed_dictionaries(
    {"team": st.sampled_from(["x", "y"]), "score": st.sampled_from([1, 2, "3"])},
    optional={"tags": arrays, "nums": arrays},
)


_etags = itertools.count()


def spec(client: Any, indexes: Any = INDEXES) -> None:
    for shard in range(keys.INDEX_SHARDS):
        client.eval(SPEC.source, 1, keys.index_spec_key(COLL, shard), 1, spec_json(indexes))


def put(client: Any, doc_id: str, document: Any, worker: bool) -> Any:
    """A PUT through the store's script: with the worker's entries (``index_args``), or Redis makes them."""
    body = json.dumps(document).encode()
    script_keys = [keys.document_key(COLL, doc_id.encode()), keys.index_key_for(COLL, doc_id.encode())]
    args = index_args(INDEXES, document, doc_id.encode()) if worker else (0, b"")
    etag = b'"%d"' % next(_etags)  # a new ETag each write: the script takes one it holds for this write again
    return client.eval(scripts.PUT.source, 2, *script_keys, doc_id, body, etag, b"date", b"0", b"", b"", 0, *args)


def delete(client: Any, doc_id: str) -> Any:
    script_keys = [keys.document_key(COLL, doc_id.encode()), keys.index_key_for(COLL, doc_id.encode())]
    return client.eval(scripts.DELETE.source, 2, *script_keys, doc_id, b"")


def build(client: Any) -> None:
    for index in INDEXES:
        for shard in range(keys.INDEX_SHARDS):
            state = [0]
            while state[0] == 0:
                state = client.eval(
                    BUILD.source,
                    2,
                    keys.index_spec_key(COLL, shard),
                    keys.index_key(COLL, shard),
                    index.name,
                    index.version,
                    3,
                    1 << 20,
                )


def every_page(client: Any, arguments: Dict[str, List[str]], limit: int, budget: int) -> List[bytes]:
    """Every page of the query, read by ``reads.run`` through the real scripts, cursor after cursor."""
    link = ScriptLink(client)
    found: List[bytes] = []
    cursor: Optional[str] = None
    for _ in range(200):
        outcome: List[Any] = []
        reads.run(link, COLL, plan(INDEXES, arguments, limit, cursor), budget).addBoth(outcome.append)
        if isinstance(outcome[0], Failure):
            outcome[0].raiseException()
        page = outcome[0]
        assert len(page.bodies) <= limit
        found += page.bodies
        if page.last is None:
            return found
        cursor = base64.urlsafe_b64encode(page.last).rstrip(b"=").decode()
    raise AssertionError("the pages did not end")


def model_entries(docs: Dict[str, Any], name: str) -> Tuple[List[bytes], Dict[str, bytes]]:
    """The index's entries and each document's field, as Python makes them (``entry``), sorted."""
    index = next(index for index in INDEXES if index.name == name)
    fields = [(field.tokens, field.type) for field in index.fields]
    packed = {doc_id: entry(doc, fields, doc_id.encode()) for doc_id, doc in docs.items()}
    made = {doc_id: value for doc_id, value in packed.items() if value is not None}
    return sorted(one for value in made.values() for one in unpack_entries(value)), made


def check_entries(client: Any, docs: Dict[str, Any]) -> None:
    for index in INDEXES:
        wanted, fields = model_entries(docs, index.name)
        found: List[bytes] = []
        for shard in range(keys.INDEX_SHARDS):
            key = keys.index_entries_key(COLL, shard, index.name.encode(), index.version.encode())
            found += client.zrange(key, 0, -1)
        assert sorted(found) == wanted, index.name
        field = b"x:%s:%s" % (index.name.encode(), index.version.encode())
        for doc_id in docs:
            held = client.hget(keys.document_key(COLL, doc_id.encode()), field)
            assert held == fields.get(doc_id), (index.name, doc_id)


def holds(array: Any, value: Any, kind: str) -> bool:
    """The model: whether ``array`` (a document's member) holds ``value`` as an element of type ``kind``."""
    if not isinstance(array, list) or len(array) > MAX_ARRAY_ENTRIES:
        return False
    wanted = encode(value, kind)
    return any(encode(element, kind) == wanted for element in array if encode(element, kind) is not None)


def cs(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if text == "" or any(char in text for char in ',{}"\\'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "cs.{" + text + "}"


def check_queries(client: Any, docs: Dict[str, Any], bodies: Dict[str, bytes], limit: int) -> None:
    for tag in [*TAGS, "none"]:
        wanted = sorted(doc_id for doc_id, doc in docs.items() if holds(doc.get("tags"), tag, "string"))
        got = every_page(client, {"tags": [cs(tag)]}, limit, 1 << 20)
        assert got == [bodies[doc_id] for doc_id in wanted], tag
    for team in ["x", "y"]:
        for number in [*NUMS, 7]:
            for descending in (False, True):
                arguments = {"team": [f"eq.{team}"], "nums": [cs(number)]}
                arguments["order"] = ["score.desc" if descending else "score.asc"]
                wanted = sorted(
                    (
                        doc_id
                        for doc_id, doc in docs.items()
                        if doc["team"] == team and is_number(doc["score"]) and holds(doc.get("nums"), number, "number")
                    ),
                    key=lambda doc_id: (docs[doc_id]["score"], doc_id),
                    reverse=descending,
                )
                got = every_page(client, arguments, limit, 1 << 20)
                assert got == [bodies[doc_id] for doc_id in wanted], arguments


steps = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.one_of(st.none(), documents), st.booleans()),
    min_size=1,
    max_size=14,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=steps, after=steps, limit=st.integers(min_value=1, max_value=3))
@pytest.mark.slow
def test_writes_deletes_and_builds_keep_array_indexes_and_cs_queries_exact(redis_client, before, after, limit) -> None:
    """``before``: writes before the indexes are declared (then built); ``after``: writes that change or remove
    arrays and deletes once they are; each a (id, document or None for a delete, the worker's entries or Redis's)."""
    redis_client.flushall()
    docs: Dict[str, Any] = {}
    bodies: Dict[str, bytes] = {}
    for at, batch in enumerate((before, after)):
        for doc_id, document, worker in batch:
            if document is None:
                if delete(redis_client, doc_id) == 1:
                    del docs[doc_id], bodies[doc_id]
                continue
            put(redis_client, doc_id, document, worker and at == 1)
            docs[doc_id], bodies[doc_id] = document, json.dumps(document).encode()
        if at == 0:
            spec(redis_client)
            build(redis_client)
        check_entries(redis_client, docs)
        check_queries(redis_client, docs, bodies, limit)


def test_lua_and_python_pack_the_same_entries_in_the_arrays_order_each_once(redis_client) -> None:
    redis_client.flushall()
    spec(redis_client)
    document = {"tags": ["b", "a", "b", 3, None, "a", "é\x00"], "team": "x", "nums": [2, 1, 2.0, -0.0, 0], "score": 1}
    put(redis_client, "p", document, worker=False)
    key = keys.document_key(COLL, b"p")
    redis_made = {
        index.name: redis_client.hget(key, b"x:%s:%s" % (index.name.encode(), index.version.encode()))
        for index in INDEXES
    }
    _, python_made = model_entries({"p": document}, "by_tags")
    assert redis_made["by_tags"] == python_made["p"]
    assert [one[:-1] for one in unpack_entries(python_made["p"])] == [encode(t, "string") for t in ["b", "a", "é\x00"]]
    _, python_made = model_entries({"p": document}, "by_team_nums")
    assert redis_made["by_team_nums"] == python_made["p"]
    assert len(unpack_entries(python_made["p"])) == 3  # 2, 1, 0 (2.0 is 2, -0 is 0)


@pytest.mark.parametrize("worker", [False, True])
def test_an_array_over_the_bound_is_refused_naming_it_and_nothing_is_written(redis_client, worker) -> None:
    redis_client.flushall()
    spec(redis_client)
    put(redis_client, "k", {"tags": ["a"], "team": "x", "score": 1}, worker)
    with pytest.raises(Exception, match=f"UNINDEXABLE index by_tags: .*at most {MAX_ARRAY_ENTRIES} elements, not 65"):
        put(redis_client, "k", {"tags": ["a"] * (MAX_ARRAY_ENTRIES + 1), "team": "x", "score": 1}, worker)
    assert put(redis_client, "k2", {"tags": ["a"] * MAX_ARRAY_ENTRIES, "team": "x", "score": 1}, worker) == 2
    check_entries(redis_client, {"k": {"tags": ["a"], "team": "x", "score": 1}, "k2": {"tags": ["a"] * 64}})


def test_a_build_leaves_out_a_document_over_the_bound(redis_client) -> None:
    redis_client.flushall()
    put(redis_client, "big", {"tags": [str(n) for n in range(MAX_ARRAY_ENTRIES + 1)]}, worker=False)
    put(redis_client, "ok", {"tags": ["1", "2"]}, worker=False)
    spec(redis_client)
    build(redis_client)
    docs = {"big": {"tags": []}, "ok": {"tags": ["1", "2"]}}
    check_entries(redis_client, docs)


def test_a_dropped_array_index_loses_its_entries_and_its_fields_are_swept(redis_client) -> None:
    redis_client.flushall()
    spec(redis_client)
    put(redis_client, "s", {"tags": ["a", "b"]}, worker=True)
    for shard in range(keys.INDEX_SHARDS):
        redis_client.eval(SPEC.source, 1, keys.index_spec_key(COLL, shard), 2, spec_json(INDEXES[1:]))
    for shard in range(keys.INDEX_SHARDS):
        dropped = keys.index_dropped_key(COLL, shard)
        for field in redis_client.hkeys(dropped):
            while redis_client.eval(SWEEP.source, 2, dropped, keys.index_key(COLL, shard), field, 2)[0] == 0:
                pass
    assert sorted(redis_client.hkeys(keys.document_key(COLL, b"s"))) == [b"b", b"e", b"m"]
    assert redis_client.keys(b"ji:{ar:*}:x:by_tags:*") == []


def test_a_query_drops_an_entry_its_document_no_longer_holds(redis_client) -> None:
    """An entry whose document's packed field lost it (rewritten outside the scripts) is stale: not answered."""
    redis_client.flushall()
    spec(redis_client)
    put(redis_client, "q", {"tags": ["a", "b"]}, worker=False)
    index = INDEXES[0]
    field = b"x:%s:%s" % (index.name.encode(), index.version.encode())
    key = keys.document_key(COLL, b"q")
    held = unpack_entries(redis_client.hget(key, field))
    redis_client.hset(key, field, held[1][:0] + bytes([0, len(held[1])]) + held[1])  # holds only "b" now
    body = json.dumps({"tags": ["a", "b"]}).encode()
    assert every_page(redis_client, {"tags": ["cs.{b}"]}, 5, 1 << 20) == [body]
    assert every_page(redis_client, {"tags": ["cs.{a}"]}, 5, 1 << 20) == []
    assert plan(INDEXES, {"tags": ["cs.{a}"]}, 5, None).index.name == "by_tags"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"tags": ["eq.red"]}, "tags is a string[] field: eq is not for it, only tags=cs.{x}"),
        ({"tags": ["in.(a,b)"]}, "in is not for it"),
        ({"tags": ["cs.{a,b}"]}, "one value"),
        ({"tags": ["cs.{}"]}, "one value"),
        ({"tags": ["cs.red"]}, "tags=cs.{x}"),
        ({"tags": ["cs.{a}", "cs.{b}"]}, "once"),
        ({"tags": ["cs.{a}"], "order": ["tags.asc"]}, "tags is an array field"),
        ({"team": ["cs.{x}"], "nums": ["cs.{1}"]}, "cs is for array fields"),
        ({"team": ["eq.x"], "nums": ["cs.{one}"]}, "not a JSON number"),
        ({"team": ["eq.x"]}, "no declared index answers"),  # by_team_nums would answer each document per element
    ],
)
def test_an_array_field_takes_cs_with_one_value_only(arguments, says) -> None:
    from cache.indexes.filters import QueryError

    with pytest.raises(QueryError, match=re.escape(says)):
        plan(INDEXES, arguments, 10, None)


def test_cs_values_are_read_as_in_values_are() -> None:
    assert plan(INDEXES, {"tags": ['cs.{"a,b"}']}, 1, None).low == b"[" + encode("a,b", "string")
    assert plan(INDEXES, {"tags": ['cs.{""}']}, 1, None).low == b"[" + encode("", "string")
    assert plan(INDEXES, {"tags": ['cs.{"\\"}\\\\"}']}, 1, None).low == b"[" + encode('"}\\', "string")
    query = plan(INDEXES, {"nums": ["cs.{1.0}"], "team": ["eq.y"], "score": ["gt.1"]}, 1, None)
    assert query.index.name == "by_team_nums"
    assert query.low[1:].startswith(encode("y", "string") + encode(1, "number"))


def test_two_array_fields_in_one_index_are_refused_and_an_array_index_has_a_version_of_its_own() -> None:
    from cache.indexes.declared import IndexDeclarationError

    with pytest.raises(IndexDeclarationError, match="at most one field of an index is an array"):
        declared_indexes(
            {
                "both": {
                    "fields": [
                        {"name": "a", "pointer": "/a", "type": "string[]"},
                        {"name": "b", "pointer": "/b", "type": "number[]"},
                    ]
                }
            }  # fmt: skip
        )
    assert [index.version[0] for index in INDEXES] == ["m", "m"]
    scalar = declared_indexes({"t": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string"}]}})
    assert scalar[0].version[0] != "m"


@settings(max_examples=200, deadline=None)
@given(old=st.one_of(st.none(), documents), new=st.one_of(st.none(), documents), tag=st.sampled_from([*TAGS, "z"]))
def test_a_live_cs_query_judges_an_event_as_the_query_answers_before_and_after(old, new, tag) -> None:
    """An event's marks as the write script makes them (each packed field after, and before where it changed):
    the live query is told when the document's array held the value before or holds it after, and matches is
    whether it holds it after; the index of many live queries judges the same."""
    from cache.feed.live_queries import LiveIndex, LiveQuery
    from cache.feed.streams import Event

    index = INDEXES[0]
    field = b"%s:%s" % (index.name.encode(), index.version.encode())
    _, before = model_entries({"d": old} if old else {}, index.name)
    _, after = model_entries({"d": new} if new else {}, index.name)
    marks = [(b"x:" + field, after["d"])] if "d" in after else []
    if before.get("d") != after.get("d"):
        marks.append((b"w:" + field, before.get("d", b"")))
    event = Event(0, (0, 0), b"put", b"d", b"e", tuple(marks))
    live = LiveQuery.of(plan(INDEXES, {"tags": [cs(tag)]}, 10, None))
    held_before = bool(old) and holds(old.get("tags"), tag, "string")
    holds_after = bool(new) and holds(new.get("tags"), tag, "string")
    wanted = holds_after if held_before or holds_after else None
    assert live.judge(event) == wanted
    assert LiveIndex([live]).judge(event) == ({} if wanted is None else {live: wanted})
