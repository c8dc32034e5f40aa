"""cache.indexes.reads on the suite's real redis-server: every page of a generated query, through the write and
query scripts and the merge, held to a Python model of the generated documents.

The documents are written by the store's PUT script (Redis computes their
entries); each query is planned (``cache.indexes.queries``) and read page
after page by ``reads.run`` itself, its pipeline sent command by command
through redis-py (``ScriptLink``), with small limits and small budgets, so
that the merge of an ``in``'s ranges across the shards, the cursor that
continues it, a page ended by a stream that had more, and the document read
alone when it is over a stream's share are all exercised. Every page keeps
its limit and its budget, and the pages together are exactly the model's
answer, in its order, each document once.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.python.failure import Failure

from cache import keys
from cache.documents import scripts
from cache.indexes import reads
from cache.indexes.declared import declared_indexes, spec_json
from cache.indexes.queries import plan
from cache.indexes.query_script import QUERY
from cache.indexes.scripts import SPEC

COLL = b"rd"
INDEXES = declared_indexes(
    {
        "by_team_score": {
            "fields": [
                {"name": "team", "pointer": "/team", "type": "string"},
                {"name": "score", "pointer": "/score", "type": "number"},
            ]
        },
        "by_score": {"fields": [{"name": "score", "pointer": "/score", "type": "number"}]},
        "by_name": {"fields": [{"name": "name", "pointer": "/name", "type": "string"}]},
        "by_flag_score": {
            "fields": [
                {"name": "flag", "pointer": "/flag", "type": "boolean"},
                {"name": "score", "pointer": "/score", "type": "number"},
            ]
        },
    }
)
TEAMS = ["x", "xy", "a,b", 'q"t', "(p)", "", "é\x00"]
NAMES = ["ann", "anne", "an", "bob", "b\x00", "", "a*", "zoë"]
SCORES = [-2, -1, 0, 0.5, 1, 2, 1e15, -0.0]
teams = st.one_of(st.sampled_from(TEAMS), st.just(7))  # a number: in no string index
scores = st.one_of(st.sampled_from(SCORES), st.just("1"))  # a string: in no number index
documents = st.dictionaries(
    st.text(alphabet="abc0123", min_size=1, max_size=3),
    st.fixed_dictionaries(
        {"team": teams, "score": scores, "name": st.sampled_from(NAMES), "flag": st.booleans()},
        optional={"pad": st.text(alphabet="p", max_size=120)},
    ),
    max_size=60,
)


class ScriptLink:
    """What ``reads.run`` needs of a link: its pipeline's outcomes, here each command sent alone by redis-py."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        client.script_load(QUERY.source)

    def pipeline_outcomes(self, commands: List[Any], scripts: List[Any]) -> defer.Deferred:
        outcomes: List[Tuple[bool, Any]] = []
        for command in commands:
            try:
                outcomes.append((True, self.client.execute_command(*command)))
            except redis.ResponseError as error:
                outcomes.append((False, error))
        return defer.succeed(outcomes)


def store(client: redis.Redis, docs: Dict[str, Any]) -> Dict[str, bytes]:
    client.flushall()
    for shard in range(keys.INDEX_SHARDS):
        client.eval(SPEC.source, 1, keys.index_spec_key(COLL, shard), 1, spec_json(INDEXES))
    bodies = {}
    for doc_id, document in docs.items():
        body = json.dumps(document).encode()
        script_keys = [keys.document_key(COLL, doc_id.encode()), keys.index_key_for(COLL, doc_id.encode())]
        client.eval(scripts.PUT.source, 2, *script_keys, doc_id, body, b'"e"', b"date", b"0", b"", b"", 0, 0, b"")
        bodies[doc_id] = body
    return bodies


def every_page(client: redis.Redis, arguments: Dict[str, List[str]], limit: int, budget: int) -> List[bytes]:
    link = ScriptLink(client)
    found: List[bytes] = []
    cursor: Optional[str] = None
    for _ in range(200):
        query = plan(INDEXES, arguments, limit, cursor)
        outcome: List[Any] = []
        reads.run(link, COLL, query, budget).addBoth(outcome.append)
        if isinstance(outcome[0], Failure):
            outcome[0].raiseException()
        page = outcome[0]
        assert len(page.bodies) <= limit
        assert sum(len(body) for body in page.bodies) <= budget
        found += page.bodies
        if page.last is None:
            return found
        cursor = base64.urlsafe_b64encode(page.last).rstrip(b"=").decode()
    raise AssertionError("the pages did not end")


def written_in(values: List[Any], quote_all: bool) -> str:
    """``in.(...)`` as a client writes it: a value quoted where it must be (or always, with ``quote_all``)."""

    def one(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value)
        if quote_all or text == "" or any(char in text for char in ',()"\\'):
            return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return text

    return "in.(" + ",".join(one(value) for value in values) + ")"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


Model = Tuple[Dict[str, List[str]], Callable[[Any], bool], Callable[[str, Any], Any], bool]


@st.composite
def queries(draw: Any) -> Model:
    """Arguments of a query with an ``in`` or a prefix (``like``), and the model's filter, sort key and direction."""
    which = draw(st.sampled_from(["team", "score", "name", "flag", "like"]))
    descending = draw(st.booleans())
    direction = "desc" if descending else "asc"
    if which == "team":
        chosen = draw(st.lists(st.sampled_from([*TEAMS, "none"]), min_size=1, max_size=5))
        arguments = {"team": [written_in(chosen, draw(st.booleans()))]}
        low = draw(st.one_of(st.none(), st.sampled_from(SCORES)))
        if low is not None:
            arguments["score"] = [f"gte.{json.dumps(low)}"]
        if low is not None or draw(st.booleans()):
            arguments["order"] = [f"score.{direction}"]
        else:
            descending = False

        def keep(doc: Any) -> bool:
            number = is_number(doc["score"])
            return doc["team"] in chosen and number and (low is None or doc["score"] >= low)

        return arguments, keep, lambda doc_id, doc: (doc["score"], doc_id), descending
    if which == "score":
        chosen = draw(st.lists(st.sampled_from([*SCORES, 3, 1.0]), min_size=1, max_size=5))
        arguments = {"score": [written_in(chosen, draw(st.booleans()))]}
        ordered = draw(st.booleans())
        if ordered:  # ordered by the in's own field: one value's documents after another's
            arguments["order"] = [f"score.{direction}"]
        else:
            descending = False
        keep = lambda doc: is_number(doc["score"]) and doc["score"] in chosen  # noqa: E731
        if ordered:
            return arguments, keep, lambda doc_id, doc: (doc["score"], doc_id), descending
        return arguments, keep, lambda doc_id, doc: doc_id, descending
    if which == "name":
        chosen = draw(st.lists(st.sampled_from([*NAMES, "carl"]), min_size=1, max_size=4))
        arguments = {"name": [written_in(chosen, draw(st.booleans()))]}
        if draw(st.booleans()):
            arguments["order"] = [f"name.{direction}"]
            return arguments, lambda doc: doc["name"] in chosen, lambda i, doc: (doc["name"].encode(), i), descending
        return arguments, lambda doc: doc["name"] in chosen, lambda doc_id, doc: doc_id, False
    if which == "like":  # a prefix: a range of by_name, in its order
        start = draw(st.sampled_from(["", "a", "an", "ann", "b\x00", "zo", "é", "b"]))
        arguments = {"name": [f"like.{start}*"]}
        if not draw(st.booleans()):
            descending = False
        else:
            arguments["order"] = [f"name.{direction}"]
        keep = lambda doc: doc["name"].startswith(start)  # noqa: E731
        return arguments, keep, lambda doc_id, doc: (doc["name"].encode(), doc_id), descending
    chosen = draw(st.lists(st.booleans(), min_size=1, max_size=3))
    arguments = {"flag": [written_in(chosen, False)], "score": ["lt.1"], "order": [f"score.{direction}"]}

    def flagged(doc: Any) -> bool:
        return doc["flag"] in chosen and is_number(doc["score"]) and doc["score"] < 1

    return arguments, flagged, lambda doc_id, doc: (doc["score"], doc_id), descending


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=documents,
    query=queries(),
    limit=st.integers(min_value=1, max_value=4),
    share=st.sampled_from([0, 60, 150, 1 << 20]),
)
@pytest.mark.slow
def test_every_page_of_an_in_or_a_prefix_is_the_models_answer(redis_client, docs, query, limit, share) -> None:
    """``share``: each stream's bytes (the budget is that for each shard and range): 0, the least budget (most
    documents are read alone), one or two documents (a stream stops with more: the page ends there), or more
    than all. Never below the largest document and its entry: none is larger (api.config)."""
    arguments, keep, key, descending = query
    bodies = store(redis_client, docs)
    streams = keys.INDEX_SHARDS * len(plan(INDEXES, arguments, limit, None).ranges)
    largest = max((len(body) for body in bodies.values()), default=0) + 64
    budget = max(largest, min(share * streams, 1 << 20))
    wanted = sorted((doc_id for doc_id, doc in docs.items() if keep(doc)), key=lambda d: key(d, docs[d]))
    if descending:
        wanted.reverse()
    assert every_page(redis_client, arguments, limit, budget) == [bodies[doc_id] for doc_id in wanted], arguments
