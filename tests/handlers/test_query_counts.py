"""Counts over HTTP (issue #59): ``Prefer: count=exact`` on queries and list pages, held to Python.

Generated documents and generated queries (every operator: eq, ranges,
``in``, ``like``, ``cs`` and ``cs`` beside ``in``), each paged through by a
small limit: every page's ``Content-Range`` is ``first-last/total`` with the
page's own positions and Python's total, ``*/total`` when it is empty, and
``Preference-Applied`` names the count. Then how ``Prefer`` is read (unknown
or unfulfillable preferences ignored, ``handling=strict`` a 400) and the
count's place in the page's ETag. On one Redis and the 3-master cluster
(make test-cluster).
"""

from __future__ import annotations

import http.client
import random
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import quote, urlsplit

import pytest

from tests.handlers.test_queries import INDEXES, PROBLEM, declare, in_list, put, wait_built
from tests.handlers.test_query_arrays import cs, holds

COUNTED = {
    **INDEXES,
    "by_tags_customer": {
        "fields": [
            {"name": "tags", "pointer": "/tags", "type": "string[]"},
            {"name": "customer", "pointer": "/customer/id", "type": "string"},
        ]
    },
}
CUSTOMERS = ["ann", "bob", "cy", "a,b"]
TAGS = ["red", "blue", "re", ""]


def generated(count: int, rng: random.Random) -> Dict[str, Dict[str, Any]]:
    return {
        f"c{n:03d}": {
            "customer": {"id": rng.choice(CUSTOMERS)},
            "created": rng.choice([rng.randint(-20, 20), rng.random() * 10, 1e15]),
            "email": rng.choice(["ann", "anne", "an", "bob", "zoë"]) + f"{n % 3}@x",
            # Duplicates, a number beside strings (no entry of its own), a string that is not an array.
            "tags": [rng.choice([*TAGS, 3]) for _ in range(rng.randrange(5))] if rng.random() < 0.9 else "red",
        }
        for n in range(count)
    }


def paged(api, query: str, limit: int, prefer: str = "count=exact") -> Tuple[List[Any], List[str], List[int]]:
    """Every page of ``query`` (``""``: the list), each asked with ``prefer``: the documents, each page's
    ``Content-Range`` and its number of documents."""
    found: List[Any] = []
    ranges: List[str] = []
    sizes: List[int] = []
    cursor: Optional[str] = None
    while True:
        url = f"/v1/counted?{query}&limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        answer = api.get(url, headers={"Prefer": prefer})
        assert answer.status_code == 200, answer.text
        assert answer.headers["Preference-Applied"] == prefer, query
        assert "Prefer" in answer.headers["Vary"]
        ranges.append(answer.headers["Content-Range"])
        page = answer.json()
        found += page["items"]
        sizes.append(len(page["items"]))
        cursor = page["next"]
        if cursor is None:
            return found, ranges, sizes


def expected_ranges(total: int, pages: List[int]) -> List[str]:
    """The ``Content-Range`` of each page, of ``pages[n]`` documents, of a ``total`` paged in order."""
    ranges, first = [], 0
    for answered in pages:
        ranges.append(f"{first}-{first + answered - 1}/{total}" if answered else f"*/{total}")
        first += answered
    return ranges


def generated_query(rng: random.Random, docs: Dict[str, Any]) -> Tuple[str, Callable[[Dict[str, Any]], bool]]:
    """A query of one of the operators and what Python says matches it."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    which = rng.choice(["eq", "range", "in", "in-range", "like", "cs", "cs-in", "none"])
    if which == "eq":
        customer = rng.choice([*CUSTOMERS, "nobody"])
        return f"customer=eq.{quote(customer)}", lambda d: d["customer"]["id"] == customer
    if which == "range":
        low, high = sorted(rng.sample(range(-25, 25), 2))
        ops = rng.choice([("gt", "lte"), ("gte", "lt")])
        query = f"created={ops[0]}.{low}&created={ops[1]}.{high}&order=created.{rng.choice(['asc', 'desc'])}"
        inside = (lambda v: low < v <= high) if ops[0] == "gt" else (lambda v: low <= v < high)
        return query, lambda d: number(d["created"]) and inside(d["created"])
    if which in ("in", "in-range"):
        chosen = rng.sample([*CUSTOMERS, "nobody"], rng.randint(1, 4))
        query = f"customer={in_list(chosen)}&order=created.{rng.choice(['asc', 'desc'])}"
        low = rng.randint(-10, 10) if which == "in-range" else None
        query += f"&created=gte.{low}" if low is not None else ""
        return query, lambda d: d["customer"]["id"] in chosen and number(d["created"]) and (
            low is None or d["created"] >= low
        )
    if which == "like":
        start = rng.choice(["", "a", "an", "ann", "bo", "zo", "q"])
        return f"email=like.{start}*", lambda d: d["email"].startswith(start)
    if which in ("cs", "cs-in"):
        tag = rng.choice([*TAGS, "none"])
        if which == "cs":
            return f"tags={cs(tag)}", lambda d: holds(d, "tags", tag)
        chosen = rng.sample(CUSTOMERS, rng.randint(1, 3))
        return f"tags={cs(tag)}&customer={in_list(chosen)}", lambda d: holds(d, "tags", tag) and (
            d["customer"]["id"] in chosen
        )
    return "", lambda d: True  # the list, in id order


@pytest.mark.slow
def test_generated_queries_and_list_pages_count_what_python_computes(api) -> None:
    rng = random.Random(5959)
    docs = generated(120, rng)
    for doc_id, doc in docs.items():
        put(api, "counted", doc_id, doc)
    declare(api, "counted", COUNTED)  # built over the documents already there
    wait_built(api, "counted", f"tags={cs('red')}")
    for _ in range(3):
        for _ in range(25):
            query, matches = generated_query(rng, docs)
            limit = rng.choice([1, 4, 13, 200])
            found, ranges, sizes = paged(api, query, limit, rng.choice(["count=exact", "count=estimated"]))
            total = sum(matches(d) for d in docs.values())
            assert len(found) == total and all(matches(d) for d in found), query
            # Each page's place: the documents of the pages before it (full ones, but for a budget's).
            assert ranges == expected_ranges(total, sizes), (query, limit)
        for _ in range(30):  # rewrites, new documents and deletes between rounds
            doc_id = f"c{rng.randrange(140):03d}"
            if doc_id in docs and rng.random() < 0.3:
                assert api.delete(f"/v1/counted/{doc_id}").status_code == 204
                del docs[doc_id]
            else:
                docs[doc_id] = generated(1, rng)["c000"]
                put(api, "counted", doc_id, docs[doc_id])


def test_an_empty_answer_counts_zero_and_a_page_past_the_end_keeps_its_total(api) -> None:
    declare(api, "counted", COUNTED)
    answer = api.get("/v1/counted?customer=eq.nobody", headers={"Prefer": "count=exact"})
    assert answer.headers["Content-Range"] == "*/0" and answer.json() == {"items": [], "next": None}
    assert api.get("/v1/counted", headers={"Prefer": "count=exact"}).headers["Content-Range"] == "*/0"
    for n in range(3):
        put(api, "counted", f"d{n}", {"customer": {"id": "ann"}, "created": n})
    # A cursor past every entry: an empty page, the total still counted, the page's place at the end.
    past = "enp6"  # base64url of "zzz": after every id and entry here
    answer = api.get(f"/v1/counted?customer=eq.ann&cursor={past}", headers={"Prefer": "count=exact"})
    assert answer.headers["Content-Range"] == "*/3"
    assert api.get(f"/v1/counted?cursor={past}", headers={"Prefer": "count=exact"}).headers["Content-Range"] == "*/3"
    answer = api.get("/v1/counted?customer=eq.ann&limit=2", headers={"Prefer": "count=exact"})
    assert answer.headers["Content-Range"] == "0-1/3"
    following = api.get(f"/v1/counted?customer=eq.ann&limit=2&cursor={answer.json()['next']}",
                        headers={"Prefer": "count=exact"})  # fmt: skip
    assert following.headers["Content-Range"] == "2-2/3"


def test_unknown_preferences_are_ignored_and_strict_handling_refuses_them(api) -> None:
    declare(api, "counted", COUNTED)
    put(api, "counted", "a", {"customer": {"id": "ann"}, "created": 1})
    for query in ("customer=eq.ann", ""):
        plain = api.get(f"/v1/counted?{query}")
        assert "Content-Range" not in plain.headers and "Preference-Applied" not in plain.headers
        for ignored in ("count=planned", "count=nonsense", "count", "return=minimal", "handling=lenient, foo"):
            answer = api.get(f"/v1/counted?{query}", headers={"Prefer": ignored})
            assert answer.status_code == 200, (ignored, answer.text)
            assert "Content-Range" not in answer.headers and "Preference-Applied" not in answer.headers, ignored
            assert answer.content == plain.content
        # Case-insensitive, among others, with parameters, quoted, or in a second Prefer header.
        for asked in ("COUNT=Exact", "return=minimal, count=exact;x=1", 'count="exact"', "foo, count=exact"):
            answer = api.get(f"/v1/counted?{query}", headers={"Prefer": asked})
            assert answer.headers["Content-Range"] == "0-0/1", asked
            assert answer.headers["Preference-Applied"] == "count=exact"
        assert twice_preferred(api, f"/v1/counted?{query}", "foo", "count=estimated") == "count=estimated"
        for strict in ("handling=strict, count=planned", "count=exact, handling=strict, return=minimal"):
            answer = api.get(f"/v1/counted?{query}", headers={"Prefer": strict})
            assert answer.status_code == 400 and answer.json()["type"] == PROBLEM + "invalid-preference", strict
            assert "handling=strict" in answer.json()["detail"]
        assert api.get(f"/v1/counted?{query}", headers={"Prefer": "handling=strict, count=exact"}).status_code == 200


def twice_preferred(api, path: str, first: str, second: str) -> Optional[str]:
    """The ``Preference-Applied`` of a GET that carries two ``Prefer`` headers (requests merges them)."""
    address = urlsplit(api.server.url(path))
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.putrequest("GET", path)
        connection.putheader("Authorization", api.auth_header["Authorization"])
        connection.putheader("Prefer", first)
        connection.putheader("Prefer", second)
        connection.endheaders()
        answer = connection.getresponse()
        answer.read()
        return answer.getheader("Preference-Applied")
    finally:
        connection.close()


def test_in_on_an_array_field_is_refused_so_no_document_is_counted_twice(api) -> None:
    """A document's array holds many elements, so in (or a range) on one would meet a document once per
    element it names: refused, naming why; cs.{x}, one element, is counted once however often it is held."""
    declare(api, "counted", COUNTED)
    put(api, "counted", "twice", {"tags": ["red", "red", "blue"], "customer": {"id": "ann"}})
    answer = api.get(f"/v1/counted?tags={in_list(['red', 'blue'])}", headers={"Prefer": "count=exact"})
    assert answer.status_code == 400 and answer.json()["type"] == PROBLEM + "invalid-query"
    assert "in is not for it, only tags=cs.{x}" in answer.json()["detail"]
    answer = api.get(f"/v1/counted?tags={cs('red')}", headers={"Prefer": "count=exact"})
    assert answer.headers["Content-Range"] == "0-0/1" and len(answer.json()["items"]) == 1


def test_a_counted_pages_etag_names_its_count(api) -> None:
    declare(api, "counted", COUNTED)
    for n in range(3):
        put(api, "counted", f"d{n}", {"customer": {"id": "ann"}, "created": n})
    counted = {"Prefer": "count=exact"}
    plain = api.get("/v1/counted?customer=eq.ann&limit=1")
    first = api.get("/v1/counted?customer=eq.ann&limit=1", headers=counted)
    assert first.content == plain.content and first.headers["ETag"] != plain.headers["ETag"]
    again = api.get("/v1/counted?customer=eq.ann&limit=1", headers={**counted, "If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304
    put(api, "counted", "d9", {"customer": {"id": "ann"}, "created": 9})  # the page is the same, its count not
    after = api.get("/v1/counted?customer=eq.ann&limit=1", headers={**counted, "If-None-Match": first.headers["ETag"]})
    assert after.status_code == 200 and after.headers["Content-Range"] == "0-0/4"


def each_node(redis_server, ask: Callable[[Any], int]) -> int:
    """The sum of ``ask(client)`` over every master (one, or a cluster's)."""
    clients = [node.client() for node in getattr(redis_server, "nodes", ())] or [redis_server.client()]
    try:
        return sum(ask(client) for client in clients)
    finally:
        for client in clients:
            client.close()


def calls(redis_server, command: str) -> int:
    """``command``'s calls since the last ``CONFIG RESETSTAT``, over every master."""
    return each_node(redis_server, lambda c: c.info("commandstats").get(f"cmdstat_{command}", {"calls": 0})["calls"])


def test_a_count_reads_no_document(api, redis_server) -> None:
    """The count is ZLEXCOUNT (or ZCARD) per shard: however many documents match, none is read for it."""
    declare(api, "counted", COUNTED)
    for n in range(50):
        put(api, "counted", f"d{n:02d}", {"customer": {"id": "ann"}, "created": n})
    answer = api.get("/v1/counted?customer=eq.ann&limit=1", headers={"Prefer": "count=exact"})
    assert answer.headers["Content-Range"] == "0-0/50"
    each_node(redis_server, lambda client: client.config_resetstat() and 0)
    api.get("/v1/counted?customer=eq.ann&limit=1", headers={"Prefer": "count=exact"})
    # One page of one document reads at most one body a shard (its HMGET in the query's script), not 50; the
    # count is one ZLEXCOUNT a shard.
    assert calls(redis_server, "zlexcount") == 16
    assert calls(redis_server, "hmget") <= 16
