"""cache.indexes.scripts on the suite's real redis-server: entries kept by the write scripts, built, queried.

The writes go through ``cache.documents.scripts``' PUT and DELETE as the store calls
them; the entries Redis computes in Lua must be the very bytes
``cache.indexes.values`` computes in Python (a query's bounds are made
there), over generated documents.
"""

from __future__ import annotations

import json
from typing import Any, List

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import keys
from cache.documents import scripts
from cache.indexes.declared import declared_indexes, index_args, spec_json
from cache.indexes.query_script import QUERY
from cache.indexes.scripts import BUILD, SPEC, SWEEP
from cache.indexes.values import EXACT_INTEGERS, MAX_STRING_BYTES, entry

COLL = b"ix"
INDEXES = declared_indexes(
    {
        "by_email": {"fields": [{"name": "email", "pointer": "/email", "type": "string"}]},
        "by_age": {"fields": [{"name": "age", "pointer": "/age", "type": "number"}]},
        "by_team_age": {
            "fields": [
                {"name": "team", "pointer": "/team/name", "type": "string"},
                {"name": "age", "pointer": "/age", "type": "number"},
            ]
        },
        "by_flag": {"fields": [{"name": "flag", "pointer": "/tags/0", "type": "boolean"}]},
    }
)


def spec(client: Any, generation: int = 1, indexes: Any = INDEXES) -> None:
    for shard in range(keys.INDEX_SHARDS):
        client.eval(SPEC.source, 1, keys.index_spec_key(COLL, shard), generation, spec_json(indexes))


def put(client: Any, doc_id: bytes, document: Any, etag: bytes = b'"e"', given: Any = None) -> Any:
    """A PUT through the store's script; ``given``: the worker's entries (``index_args``), else Redis makes them."""
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    script_keys = [keys.document_key(COLL, doc_id), keys.index_key_for(COLL, doc_id)]
    args = (0, b"") if given is None else given
    return client.eval(scripts.PUT.source, 2, *script_keys, doc_id, body, etag, b"date", b"0", b"", b"", 0, *args)


def delete(client: Any, doc_id: bytes) -> Any:
    script_keys = [keys.document_key(COLL, doc_id), keys.index_key_for(COLL, doc_id)]
    return client.eval(scripts.DELETE.source, 2, *script_keys, doc_id, b"")


def entries(client: Any, index_name: str) -> List[bytes]:
    index = next(index for index in INDEXES if index.name == index_name)
    found: List[bytes] = []
    for shard in range(keys.INDEX_SHARDS):
        key = keys.index_entries_key(COLL, shard, index.name.encode(), index.version.encode())
        found += client.zrange(key, 0, -1)
    return sorted(found)


def expected(documents: dict, index_name: str) -> List[bytes]:
    index = next(index for index in INDEXES if index.name == index_name)
    fields = [(field.tokens, field.type) for field in index.fields]
    made = [entry(document, fields, doc_id) for doc_id, document in documents.items()]
    return sorted(made_entry for made_entry in made if made_entry is not None)


def test_writes_keep_every_index_exact(redis_client) -> None:
    spec(redis_client)
    documents = {
        b"a": {"email": "a@x", "age": 30, "team": {"name": "red"}, "tags": [True]},
        b"b": {"email": "b@x", "age": 30.5, "team": {"name": "red"}, "tags": [False, 1]},
        b"c": {"email": 7, "age": "old", "team": {"name": "blue"}},  # wrong types: in none of those
        b"d": {"age": -2, "team": {}},
    }
    for doc_id, document in documents.items():
        assert put(redis_client, doc_id, document) == 2
    for name in ("by_email", "by_age", "by_team_age", "by_flag"):
        assert entries(redis_client, name) == expected(documents, name), name
    # A rewrite moves its entries; a delete removes them.
    documents[b"a"] = {"email": "z@x", "age": 31, "team": {"name": "blue"}, "tags": [False]}
    assert put(redis_client, b"a", documents[b"a"], b'"e2"') == 1
    assert delete(redis_client, b"b") == 1
    del documents[b"b"]
    for name in ("by_email", "by_age", "by_team_age", "by_flag"):
        assert entries(redis_client, name) == expected(documents, name), name


def test_the_workers_entries_are_taken_only_for_the_spec_they_were_made_for(redis_client) -> None:
    spec(redis_client)
    document = {"email": "a@x", "age": 3, "team": {"name": "red"}, "tags": [True]}
    given = index_args(INDEXES, document, b"g1")
    assert put(redis_client, b"g1", document, given=given) == 2
    for name in ("by_email", "by_age", "by_team_age", "by_flag"):
        assert entries(redis_client, name) == expected({b"g1": document}, name), name
    # Made for other indexes (a worker that has not heard of a change): Redis computes its own.
    stale = index_args(INDEXES[:1], {"email": "wrong@x"}, b"g1")
    assert put(redis_client, b"g1", document, b'"e2"', given=stale) == 1
    assert entries(redis_client, "by_email") == expected({b"g1": document}, "by_email")
    # The same digest, believed: what the worker computed is what the shard keeps (hypothesis holds them equal).
    lie = index_args(INDEXES, {"email": "told@x"}, b"g1")
    assert put(redis_client, b"g1", document, b'"e3"', given=lie) == 1
    assert entries(redis_client, "by_email") == expected({b"g1": {"email": "told@x"}}, "by_email")


def test_a_collection_without_indexes_writes_as_before(redis_client) -> None:
    assert put(redis_client, b"a", {"email": "a@x"}) == 2
    assert redis_client.keys(b"ji:{ix:*}*") == []


def test_a_document_cjson_cannot_read_is_refused_before_anything_is_written(redis_client) -> None:
    spec(redis_client)
    deep = b"[" * 1001 + b"]" * 1001
    with pytest.raises(Exception, match="UNINDEXABLE"):
        put(redis_client, b"deep", b'{"a":' + deep + b"}")
    assert not redis_client.exists(keys.document_key(COLL, b"deep"))


def build(client: Any, index_name: str, documents: int, most_bytes: int) -> int:
    """Every shard's ``BUILD`` steps of the index, as ``cache.indexes.builds`` runs them; how many steps."""
    index = next(index for index in INDEXES if index.name == index_name)
    steps = 0
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
                documents,
                most_bytes,
            )
            steps += 1
    return steps


def test_the_build_indexes_what_was_there_and_dropping_removes_it(redis_client) -> None:
    documents = {b"%03d" % n: {"email": f"{n}@x", "age": n % 7} for n in range(120)}
    for doc_id, document in documents.items():
        put(redis_client, doc_id, document)
    spec(redis_client)
    assert entries(redis_client, "by_email") == []  # declared: not built yet
    build(redis_client, "by_email", 3, 1 << 20)
    assert entries(redis_client, "by_email") == expected(documents, "by_email")
    assert entries(redis_client, "by_age") == []  # its own build has not run
    spec(redis_client, 2, ())
    # The entries go at once; each document's field is the sweep's, listed by shard.
    assert sorted(set(redis_client.keys(b"ji:{ix:*}*"))) == sorted(
        keys.index_dropped_key(COLL, shard) for shard in range(keys.INDEX_SHARDS)
    )
    assert entry_fields(redis_client) == len(documents)
    steps = sweep(redis_client, 7)
    per_field = sum(redis_client.zcard(keys.index_key(COLL, s)) // 7 + 1 for s in range(keys.INDEX_SHARDS))
    assert steps == len(INDEXES) * per_field  # each dropped index's field, built or not: writes may have set it
    assert redis_client.keys(b"ji:{ix:*}*") == [] and entry_fields(redis_client) == 0


def test_an_index_declared_again_before_its_sweep_is_built_again_and_not_swept(redis_client) -> None:
    documents = {b"%03d" % n: {"email": f"{n}@x", "age": n % 7} for n in range(60)}
    for doc_id, document in documents.items():
        put(redis_client, doc_id, document)
    spec(redis_client)
    build(redis_client, "by_email", 100, 1 << 20)
    spec(redis_client, 2, ())
    sweep(redis_client, 2, most_steps=1)  # a first step of each shard's sweep, then the index is back
    spec(redis_client, 3)
    assert all(redis_client.hlen(keys.index_dropped_key(COLL, s)) == 0 for s in range(keys.INDEX_SHARDS))
    build(redis_client, "by_email", 100, 1 << 20)
    assert entries(redis_client, "by_email") == expected(documents, "by_email")
    assert entry_fields(redis_client) == len(documents)


def entry_fields(client: Any) -> int:
    """How many index fields the collection's documents' hashes hold."""
    return sum(
        sum(1 for field in client.hkeys(key) if field.startswith(b"x:")) for key in client.keys(b"jw:{ix:*}:d:*")
    )


def sweep(client: Any, step: int, most_steps: int = 1 << 30) -> int:
    """Every shard's ``SWEEP`` steps of each dropped field, as ``cache.indexes.builds`` runs them; how many."""
    steps = 0
    for shard in range(keys.INDEX_SHARDS):
        dropped = keys.index_dropped_key(COLL, shard)
        for field in client.hkeys(dropped):
            done, taken = 0, 0
            while not done and taken < most_steps:
                done, _ = client.eval(SWEEP.source, 2, dropped, keys.index_key(COLL, shard), field, step)
                steps, taken = steps + 1, taken + 1
    return steps


def test_a_build_step_stops_at_its_bytes(redis_client) -> None:
    for n in range(40):
        put(redis_client, b"big%d" % n, {"email": f"{n}@x", "pad": "x" * 1000})
    spec(redis_client)
    steps = build(redis_client, "by_email", 256, 500)
    per_shard = [redis_client.zcard(keys.index_key(COLL, shard)) for shard in range(keys.INDEX_SHARDS)]
    assert steps == sum(max(count, 1) for count in per_shard)  # one document a step: each is over the bytes
    assert len(entries(redis_client, "by_email")) == 40


def query(client: Any, shard: int, index_name: str, low: bytes, high: bytes, limit: int, descending: bool = False):
    index = next(index for index in INDEXES if index.name == index_name)
    return client.eval(
        QUERY.source,
        2,
        keys.index_spec_key(COLL, shard),
        keys.index_entries_key(COLL, shard, index.name.encode(), index.version.encode()),
        index.name,
        index.version,
        low,
        high,
        b"1" if descending else b"0",
        limit,
        1 << 20,
        index.kinds(),
        1000,
    )


def test_a_query_reads_bodies_that_hold_their_entry_and_drops_stale_entries(redis_client) -> None:
    spec(redis_client)
    doc_id = b"q1"
    shard = keys.shard_of(doc_id)
    put(redis_client, doc_id, {"email": "q@x"})
    answer = query(redis_client, shard, "by_email", b"-", b"+", 10)
    assert answer[0] == b"end" and answer[3] == b'{"email": "q@x"}'
    # Expired (or removed outside the scripts): its entry goes when a query meets it.
    redis_client.delete(keys.document_key(COLL, doc_id))
    assert query(redis_client, shard, "by_email", b"-", b"+", 10) == [b"end", b""]
    assert entries(redis_client, "by_email") == []


values = st.one_of(
    st.text(max_size=8),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(email=values, age=values, team=values, flag=values)
@pytest.mark.slow
def test_lua_and_python_make_the_same_entries(redis_client, email, age, team, flag) -> None:
    spec(redis_client)
    document = {"email": email, "age": age, "team": {"name": team}, "tags": [flag]}
    put(redis_client, b"h", document)
    for name in ("by_email", "by_age", "by_team_age", "by_flag"):
        assert entries(redis_client, name) == expected({b"h": document}, name), (name, document)
    delete(redis_client, b"h")
    # And the fields the worker names are the ones Redis names: its entries replace Redis's exactly.
    put(redis_client, b"h", document, given=index_args(INDEXES, document, b"h"))
    for name in ("by_email", "by_age", "by_team_age", "by_flag"):
        assert entries(redis_client, name) == expected({b"h": document}, name), (name, document)
    assert delete(redis_client, b"h") == 1
    assert all(entries(redis_client, name) == [] for name in ("by_email", "by_age", "by_team_age", "by_flag"))


def test_strings_at_the_edge_of_their_length(redis_client) -> None:
    spec(redis_client)
    longest = {"email": "é" * (MAX_STRING_BYTES // 2)}
    put(redis_client, b"s1", longest)
    put(redis_client, b"s2", {"email": "é" * (MAX_STRING_BYTES // 2) + "x"})  # one byte more: not indexed
    assert entries(redis_client, "by_email") == expected({b"s1": longest}, "by_email") != []


def test_numbers_at_the_edge_of_exactness(redis_client) -> None:
    spec(redis_client)
    document = {"age": EXACT_INTEGERS - 1}
    put(redis_client, b"n1", document)
    put(redis_client, b"n2", b'{"age": 9007199254740993}')  # a double would call it 2**53: not indexed
    assert entries(redis_client, "by_age") == expected({b"n1": document}, "by_age")
