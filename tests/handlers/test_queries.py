"""Queries over declared indexes through real HTTP, on the suite's 2-worker server and real redis-server.

Declared in a collection's settings, kept by every write path (PUT, POST,
PATCH, DELETE, a batch, an import), built over the documents already there,
answered from the stored bytes in the index's order with a cursor; a query
no index answers is a 400 naming the index to declare. Each answer is held
to the same query computed in Python over what the test wrote.
"""

from __future__ import annotations

import base64
import json
import random
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote

import pytest
import requests

from cache import keys

PROBLEM = "urn:jetway:problem:"
INDEXES = {
    "by_email": {"fields": [{"name": "email", "pointer": "/email", "type": "string"}]},
    "by_customer_created": {
        "fields": [
            {"name": "customer", "pointer": "/customer/id", "type": "string"},
            {"name": "created", "pointer": "/created", "type": "number"},
        ]
    },
    "by_created": {"fields": [{"name": "created", "pointer": "/created", "type": "number"}]},
}


def declare(api, collection: str, indexes: Dict[str, Any] = INDEXES) -> requests.Response:
    answer = api.put_json(f"/v1/_collections/{collection}", json.dumps({"indexes": indexes}).encode())
    assert answer.status_code in (200, 201), answer.text
    # The writes keep the indexes at once (the shards have their spec before the PUT answers); each worker's
    # settings cache, which plans queries, hears of the change within a round trip (cache/settings_cache.py).
    time.sleep(0.2)
    return answer


def put(api, collection: str, doc_id: str, document: Any) -> None:
    answer = api.put_json(f"/v1/{collection}/{doc_id}", json.dumps(document).encode())
    assert answer.status_code in (200, 201), answer.text


def query_all(api, collection: str, query: str, limit: int = 1000) -> List[Any]:
    """Every page of the query, followed by cursor."""
    found: List[Any] = []
    cursor: Optional[str] = None
    for _ in range(10_000):
        url = f"/v1/{collection}?{query}&limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        answer = api.get(url)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        found += page["items"]
        cursor = page["next"]
        if cursor is None:
            return found
    raise AssertionError("the pages did not end")


def wait_built(api, collection: str, query: str) -> None:
    """Until the query is answered: 409 while the index is built, never 400 (a worker that has not yet heard
    of the settings change reads them again before it refuses: handlers/collections.py)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = api.get(f"/v1/{collection}?{query}&limit=1")
        if answer.status_code != 409:
            assert answer.status_code == 200, answer.text
            return
        assert answer.headers["Retry-After"] == "1"
        assert answer.json()["type"] == PROBLEM + "index-building"
        time.sleep(0.05)
    raise AssertionError("the index was not built within 30 s")


def orders(count: int, seed: int = 1) -> Dict[str, Dict[str, Any]]:
    rng = random.Random(seed)
    return {
        f"o{n:04d}": {
            "customer": {"id": rng.choice(["ann", "bob", "cy"])},
            "created": rng.choice([rng.randint(-50, 50), rng.random() * 100, 1e15]),
            "email": f"user{n % 17}@example.com",
        }
        for n in range(count)
    }


def test_equality_ranges_and_order_answer_what_python_computes(api) -> None:
    declare(api, "orders")
    documents = orders(300)
    for doc_id, document in documents.items():
        put(api, "orders", doc_id, document)
    # Equality, in id order.
    found = query_all(api, "orders", "email=eq.user3@example.com", limit=7)
    assert found == [d for _, d in sorted(documents.items()) if d["email"] == "user3@example.com"]
    # Equality then a range, newest first, paged.
    found = query_all(api, "orders", "customer=eq.bob&created=gte.0&created=lt.60&order=created.desc", limit=9)
    wanted = sorted(
        (
            (d["created"], doc_id)
            for doc_id, d in documents.items()
            if d["customer"]["id"] == "bob" and 0 <= d["created"] < 60
        ),
        reverse=True,
    )
    assert found == [documents[doc_id] for _, doc_id in wanted]
    # A range on the first field of a one-field index, ascending.
    found = query_all(api, "orders", "created=gt.10&created=lte.90", limit=50)
    wanted = sorted((d["created"], doc_id) for doc_id, d in documents.items() if 10 < d["created"] <= 90)
    assert found == [documents[doc_id] for _, doc_id in wanted]


def in_list(values: List[Any]) -> str:
    """``in.(...)`` with each value quoted where it must be, URL-encoded."""
    written = []
    for value in values:
        text = value if isinstance(value, str) else json.dumps(value)
        if text == "" or any(char in text for char in ',()"\\'):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        written.append(text)
    return quote("in.(" + ",".join(written) + ")")


@pytest.mark.slow
def test_generated_in_queries_answer_what_python_computes(api) -> None:
    """``in`` over generated documents and queries: the ranges of its values merged in the order of what follows
    them (or, ordered by the in's field, one after another), paged by small limits, held to Python's answer."""
    email, customer = INDEXES["by_email"]["fields"][0], INDEXES["by_customer_created"]["fields"][0]
    declare(api, "states", {**INDEXES, "by_email_customer": {"fields": [email, customer]}})
    documents = orders(250, seed=5)
    documents["o9998"] = {"customer": {"id": "a,b"}, "created": 5, "email": 'q"t@x'}
    # In no index but by_email:
    documents["o9999"] = {"customer": {"id": 3}, "created": "5", "email": "user1@example.com"}
    for doc_id, document in documents.items():
        put(api, "states", doc_id, document)
    rng = random.Random(59)
    customers = ["ann", "bob", "cy", "nobody", "a,b"]
    emails = [f"user{n}@example.com" for n in range(17)] + ['q"t@x']
    createds = sorted({d["created"] for d in documents.values() if isinstance(d["created"], (int, float))})
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    for _ in range(40):
        limit = rng.choice([1, 2, 5, 50])
        which = rng.choice(["customer", "created", "email"])
        descending = rng.random() < 0.5
        direction = "desc" if descending else "asc"
        if which == "customer":  # by_customer_created: merged by created, then id
            chosen = rng.sample(customers, rng.randint(1, 4))
            low = rng.choice([None, -10, 0, 50])
            query = f"customer={in_list(chosen)}&order=created.{direction}"
            query += f"&created=gte.{low}" if low is not None else ""
            found = [(d["created"], doc_id) for doc_id, d in documents.items() if d["customer"]["id"] in chosen
                     and number(d["created"]) and (low is None or d["created"] >= low)]  # fmt: skip
        elif which == "created":  # by_created, ordered by the in's own field: one value after another
            chosen = rng.sample(createds, rng.randint(1, 6))
            query = f"created={in_list(chosen)}&order=created.{direction}"
            found = [(d["created"], doc_id) for doc_id, d in documents.items() if number(d["created"])
                     and d["created"] in chosen]  # fmt: skip
        else:  # by_email_customer with the in on email: merged by customer, then id
            chosen = rng.sample(emails, rng.randint(1, 5))
            query = f"email={in_list(chosen)}&customer=eq.bob"
            descending = False
            found = [(0, doc_id) for doc_id, d in documents.items() if d["email"] in chosen
                     and d["customer"]["id"] == "bob"]  # fmt: skip
        wanted = [documents[doc_id] for _, doc_id in sorted(found, reverse=descending)]
        assert query_all(api, "states", query, limit=limit) == wanted, query


def test_a_prefix_answers_the_strings_that_start_with_it_in_order(api) -> None:
    """``like.<text>*`` on generated documents: a range of the index, in its order (or reversed), paged."""
    declare(api, "names")
    rng = random.Random(60)
    starts = ["ann", "anne", "an", "bob", "b*x", "zoë", "", "a%b"]
    emails = {f"d{n:03d}": rng.choice(starts) + rng.choice(["", "@x", "1"]) for n in range(120)}
    emails["dnul"] = "an\u0000y"
    for doc_id, email in emails.items():
        put(api, "names", doc_id, {"email": email})
    for start in ("", "a", "an", "ann", "an\u0000", "b", "zo", "zoë", "q"):
        for direction in ("asc", "desc"):
            matching = [(e.encode(), d) for d, e in emails.items() if e.startswith(start)]
            wanted = sorted(matching, reverse=direction == "desc")
            query = f"email=like.{quote(start)}*&order=email.{direction}"
            found = query_all(api, "names", query, limit=rng.choice([1, 7, 100]))
            assert found == [{"email": emails[doc_id]} for _, doc_id in wanted], query
    for refused in ("like.an", "like.a*n*", "like.an%25*", "like.*an"):
        answer = api.get(f"/v1/names?email={refused}")
        assert answer.status_code == 400 and answer.json()["type"] == PROBLEM + "invalid-query", refused
        assert "email=like.abc* (a prefix, then one * at the end" in answer.json()["detail"]


def test_an_in_takes_a_stated_number_of_values(api) -> None:
    declare(api, "many")
    answer = api.get("/v1/many?customer=" + in_list([f"c{n}" for n in range(21)]))
    assert answer.status_code == 400
    assert answer.json()["type"] == PROBLEM + "invalid-query" and "more than 20 values" in answer.json()["detail"]
    assert api.get("/v1/many?customer=" + in_list([f"c{n}" for n in range(20)])).status_code == 200


def test_answers_are_the_stored_bytes_with_a_weak_etag(api) -> None:
    declare(api, "shop")
    body = b'{ "email" : "a@x",  "created": 1.50 }'
    assert api.put_json("/v1/shop/a", body).status_code == 201
    answer = api.get("/v1/shop?email=eq.a@x")
    assert answer.status_code == 200
    assert answer.content == b'{"items":[' + body + b'],"next":null}'
    etag = answer.headers["ETag"]
    assert etag.startswith("W/")
    assert api.get("/v1/shop?email=eq.a@x", headers={"If-None-Match": etag}).status_code == 304


def test_every_write_path_keeps_the_index(api) -> None:
    declare(api, "kept")
    put(api, "kept", "a", {"email": "a@x"})
    created = api.post_json("/v1/kept", b'{"email": "post@x"}')
    assert created.status_code == 201
    patched = api.patch_merge("/v1/kept/a", b'{"email": "patched@x"}')
    assert patched.status_code == 200, patched.text
    batch = {
        "operations": [
            {"op": "put", "collection": "kept", "id": "b", "document": {"email": "batch@x"}},
            {"op": "put", "collection": "kept", "id": "c", "document": {"email": "gone@x"}},
            {"op": "delete", "collection": "kept", "id": "c"},
        ]
    }
    assert api.post_json("/v1/_batch", json.dumps(batch).encode()).status_code == 200
    imported = api.send("POST", "/v1/_import/kept?id=/id", b'{"id":"i1","email":"import@x"}\n', "application/x-ndjson")
    assert imported.status_code == 200, imported.text
    emails = sorted(d["email"] for d in query_all(api, "kept", "email=gte.a"))
    assert emails == ["batch@x", "import@x", "patched@x", "post@x"]
    assert query_all(api, "kept", "email=eq.a@x") == []
    assert api.delete("/v1/kept/a").status_code == 204
    assert query_all(api, "kept", "email=eq.patched@x") == []


def test_a_query_no_index_answers_is_a_400_that_names_the_index(api) -> None:
    declare(api, "plain")
    answer = api.get("/v1/plain?age=gt.3")
    assert answer.status_code == 400
    problem = answer.json()
    assert problem["type"] == PROBLEM + "no-index"
    assert '"by_age"' in problem["detail"] and '"pointer": "/age"' in problem["detail"]
    answer = api.get("/v1/plain?email=eq.x&created=gt.1")  # no index has email then created
    assert answer.status_code == 400 and "by_email_created" in answer.json()["detail"]
    bad = api.get("/v1/plain?created=gt.abc")
    assert bad.status_code == 400 and bad.json()["type"] == PROBLEM + "invalid-query"
    # An argument that is not a filter is ignored, as before queries.
    assert api.get("/v1/plain?_=123").status_code == 200


@pytest.mark.parametrize(
    "argument",
    ["created=neq.5", "email=ilike.a*", "created=5", "email=", "created=gt.1&created=neq.2", "color=ne.red"],
)
def test_a_filter_jetway_cannot_apply_is_a_400_never_ignored(api, argument: str) -> None:
    """An operator Jetway does not know, or a declared field's argument that is not ``op.value``: 400
    ``invalid-query`` naming the operators, on a list and on a live query (issue #59: not the whole collection)."""
    declare(api, "typos")
    put(api, "typos", "a", {"email": "a@x", "created": 1})
    for path in ("/v1/typos", "/v1/_changes/typos"):
        answer = api.get(f"{path}?{argument}")
        assert answer.status_code == 400, (path, answer.text)
        problem = answer.json()
        assert problem["type"] == PROBLEM + "invalid-query", problem
        assert "eq, gt, gte, lt, lte" in problem["detail"], problem


def test_arguments_that_are_not_filters_are_ignored_or_the_operations_own(api) -> None:
    declare(api, "notfilters")
    put(api, "notfilters", "a", {"email": "a@x", "created": 1})
    for query in ("_=1700000000", "_=1700000000.5", "utm=Spring.sale", "with_ids=1", "limit=5"):
        answer = api.get(f"/v1/notfilters?{query}")
        assert answer.status_code == 200, (query, answer.text)
        assert answer.json()["items"] == [{"email": "a@x", "created": 1}]
    since = api.get("/v1/_changes/notfilters").json()["next"]
    assert api.get(f"/v1/_changes/notfilters?since={since}&wait=0&include_docs=true&_=1").status_code == 200


def test_an_index_declared_on_documents_is_built_and_dropping_it_removes_it(api, redis_client) -> None:
    documents = orders(600, seed=2)
    for doc_id, document in documents.items():
        put(api, "late", doc_id, document)
    declare(api, "late", {"by_email": INDEXES["by_email"]})
    # Built in the background by the worker that stored the settings, with no query asking for it.
    deadline = time.monotonic() + 30
    while api.get("/v1/_collections/late").headers["Index-Builds"] != "by_email=16/16":
        assert time.monotonic() < deadline, "not built within 30 s"
        time.sleep(0.05)
    wait_built(api, "late", "email=eq.user1@example.com")
    assert api.get("/v1/_collections/late").headers["Index-Builds"] == "by_email=16/16"
    steps = re.search(rb"^jetway_index_build_steps_total (\S+)$", api.get("/metrics").content, re.M)
    assert steps is not None, "the metric is exported"
    found = query_all(api, "late", "email=eq.user1@example.com")
    assert found == [d for _, d in sorted(documents.items()) if d["email"] == "user1@example.com"]
    declare(api, "late", {})
    assert redis_client.keys(b"ji:{late:*}*") == []
    assert api.get("/v1/late?email=eq.user1@example.com").status_code == 400


def test_a_cursor_cannot_widen_its_query(api) -> None:
    declare(api, "narrow")
    for n in range(5):
        put(api, "narrow", f"d{n}", {"email": f"{n}@x"})
    everything = api.get("/v1/narrow?email=gte.0&limit=1").json()
    # The first page's cursor, given to a query with a higher lower bound, starts at that bound.
    page = api.get(f"/v1/narrow?email=gte.3&limit=10&cursor={everything['next']}").json()
    assert [d["email"] for d in page["items"]] == ["3@x", "4@x"]
    # A cursor past the range ends it; one that is not base64url is a 400.
    past = quote("enp6")
    assert api.get(f"/v1/narrow?email=lt.2&cursor={past}").json() == {"items": [], "next": None}
    assert api.get("/v1/narrow?email=lt.2&cursor=%%%").status_code == 400


def test_expired_documents_are_not_answered(api, redis_client) -> None:
    declare(api, "brief")
    put(api, "brief", "a", {"email": "a@x"})
    put(api, "brief", "b", {"email": "a@x"})
    redis_client.delete(keys.document_key(b"brief", b"a"))  # as an expiry does: no script runs
    assert query_all(api, "brief", "email=eq.a@x") == [{"email": "a@x"}]


# Each reader of the race: its filters, whether a document matches them, the key the answer is in order of
# (the index's: what follows an in's value, then the id), and whether that order is descending.
RACE_READERS: Dict[str, Tuple[str, Callable[[Dict[str, Any]], bool], Callable[[Dict[str, Any]], Any], bool]] = {
    "eq": ("email=eq.hit@x", lambda d: d["email"] == "hit@x", lambda d: d["id"], False),
    "order": (
        "customer=eq.c&created=gte.0&order=created.desc",
        lambda d: d["customer"]["id"] == "c" and d["created"] >= 0,
        lambda d: (d["created"], d["id"]),
        True,
    ),
    # in on by_email: the values' ranges merged by id.
    "in": ("email=" + quote("in.(hit@x,hi@x)"), lambda d: d["email"] in ("hit@x", "hi@x"), lambda d: d["id"], False),
    # in then a range, newest first: merged by created, then id.
    "in-range": (
        "customer=" + quote("in.(c,d)") + "&created=gte.0&order=created.desc",
        lambda d: d["customer"]["id"] in ("c", "d") and d["created"] >= 0,
        lambda d: (d["created"], d["id"]),
        True,
    ),
    # in then an upper bound, no order, the values given out of the index's order: by created, then id.
    "in-below": (
        "customer=" + quote("in.(d,c)") + "&created=lt.20",
        lambda d: d["customer"]["id"] in ("c", "d") and d["created"] < 20,
        lambda d: (d["created"], d["id"]),
        False,
    ),
    # Ordered by the in's own field: one value's entries after the other's, the index's order reversed.
    "in-by-field": (
        "customer=" + quote("in.(c,d)") + "&order=customer.desc",
        lambda d: d["customer"]["id"] in ("c", "d"),
        lambda d: (d["customer"]["id"], d["created"], d["id"]),
        True,
    ),
    "like": ("email=like.hi*", lambda d: d["email"].startswith("hi"), lambda d: (d["email"], d["id"]), False),
    "like-desc": (
        "email=like.hi*&order=email.desc",
        lambda d: d["email"].startswith("hi"),
        lambda d: (d["email"], d["id"]),
        True,
    ),
    # cs on an array field (RACE_ARRAY_INDEXES), each document once however often red is in its array: alone
    # (by_tags, by id), newest first on the field after it, and under an upper bound unordered (by created).
    "cs": ("tags=" + quote("cs.{red}"), lambda d: holds_red(d), lambda d: d["id"], False),
    "cs-range": (
        "tags=" + quote("cs.{red}") + "&created=gte.0&order=created.desc",
        lambda d: holds_red(d) and d["created"] >= 0,
        lambda d: (d["created"], d["id"]),
        True,
    ),
    "cs-below": (
        "tags=" + quote("cs.{red}") + "&created=lt.20",
        lambda d: holds_red(d) and d["created"] < 20,
        lambda d: (d["created"], d["id"]),
        False,
    ),
    # A list page: every document, by id (counted by the id index).
    "list": ("", lambda d: True, lambda d: d["id"], False),
}
RACE_ARRAY_INDEXES = {
    "by_tags": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string[]"}]},
    "by_tags_created": {
        "fields": [
            {"name": "tags", "pointer": "/tags", "type": "string[]"},
            {"name": "created", "pointer": "/created", "type": "number"},
        ]
    },
}
# The writers' tags: red in, with duplicates or beside a number (no entry of its own), or out: another tag, an
# empty array, a string that is not an array (no entry), or no member at all (None).
RACE_TAGS: List[Any] = [
    ["red"], ["red", "red"], ["blue", "red", "blue", "red"], ["red", 3],
    ["blue"], ["blue", "blue"], [], [3], "red", None,
]  # fmt: skip


def holds_red(document: Dict[str, Any]) -> bool:
    return isinstance(document.get("tags"), list) and "red" in document["tags"]


class WriteLog:
    """Each document's writes as the racing writers make them: when each was sent and answered, what it wrote.

    A write takes effect at some moment between the two, so what a document
    may have been during a request is known within bounds (``states``). A
    write is logged before it is sent, so a request that ends while it is in
    flight knows of it.
    """

    # A write overtaken this long ago can no longer be what a request saw: a longer request is a failed one
    # (race). Short, so that each page's check looks at a few writes a document.
    FORGET_AFTER = 5.0

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.writes: Dict[str, List[List[Any]]] = {}  # [sent, answered (inf: in flight), document or None]

    def sent(self, doc_id: str, document: Optional[Dict[str, Any]]) -> List[Any]:
        write = [time.monotonic(), float("inf"), document]
        with self.lock:
            self.writes.setdefault(doc_id, []).append(write)
        return write

    def answered(self, doc_id: str, write: List[Any]) -> None:
        with self.lock:
            write[1] = now = time.monotonic()
            writes = self.writes[doc_id]
            old = [sent for sent, answered, _ in writes if answered < now - self.FORGET_AFTER]
            if len(old) > 1:  # those answered before an old write was sent: overtaken for every request to come
                self.writes[doc_id] = [w for w in writes if not (w[1] < now - self.FORGET_AFTER and w[1] < max(old))]

    def states(self, doc_id: str, start: float, end: float) -> List[Optional[Dict[str, Any]]]:
        """What ``doc_id`` may have been at some moment between ``start`` and ``end`` (None: absent): every write
        answered after ``start`` (or not yet) and sent before ``end``, and each answered before ``start`` that
        no write sent after it answered and answered before ``start`` overtook (absent before any write)."""
        with self.lock:
            writes = [tuple(write) for write in self.writes.get(doc_id, ())]
        states = [document for sent, answered, document in writes if answered >= start and sent <= end]
        done = [(sent, answered, document) for sent, answered, document in writes if answered < start]
        if not done:
            return [*states, None]
        newest = max(sent for sent, _, _ in done)
        return states + [document for _, answered, document in done if answered >= newest]


def counted_wrong(
    page: Dict[str, Any], content_range: str, states: List[List[Any]], matches: Callable, before: Callable
) -> str:
    """Why a page's ``Content-Range`` is not one a count could give while the documents were each in one of
    their ``states`` during the request (stable ones: one state); "" when it is.

    The total: at least the documents that matched throughout, at most those
    that matched at some moment (each shard is counted at its own moment, so
    no more can be promised). The first position: at most the documents that
    were ever before the page's cursor (``before``), at least those always
    before it, or lower to keep the range inside the total (handlers.page_counts).
    """
    answered = len(page["items"])
    shape = re.fullmatch(r"(?:(\d+)-(\d+)|\*)/(\d+)", content_range)
    if shape is None or (shape.group(1) is None) != (answered == 0):
        return f"{content_range!r} for {answered} documents"
    total = int(shape.group(3))
    low = sum(all(d is not None and matches(d) for d in may) for may in states)
    high = sum(any(d is not None and matches(d) for d in may) for may in states)
    if not low <= total <= high or answered > total:
        return f"{content_range} for {answered} documents: the total between {low} and {high}"
    if not answered:
        return ""
    first, last = int(shape.group(1)), int(shape.group(2))
    low = sum(all(d is not None and matches(d) and before(d) for d in may) for may in states)
    high = sum(any(d is not None and matches(d) and before(d) for d in may) for may in states)
    if last != first + answered - 1 or last >= total or not min(low, total - answered) <= first <= high:
        return f"{content_range} for {answered} documents: the first between {low} and {high}"
    return ""


def passed(key: Callable[[Dict[str, Any]], Any], last: Any, descending: bool) -> Callable[[Dict[str, Any]], bool]:
    """Whether a document is at or before ``last`` (a key; None: nothing is) in a query's order."""
    if last is None:
        return lambda d: False
    return (lambda d: key(d) >= last) if descending else (lambda d: key(d) <= last)


def race(
    api, collection: str, queries: int, readers: Sequence[str] = ("eq", "order"), counted: bool = False
) -> Dict[str, int]:
    """Writers flip documents in and out of queries while readers page through them; counts what went wrong.

    A wrong answer, of any page: a document answered that does not match
    its query (its body is read in the script that checks its entry, so it
    matched when read); answers out of the query's order, or one document
    twice (each page goes on strictly after the last, so a whole pass is in
    order too); or a document that matched before the query began and never
    changed, missing from it. ``queries``: the requests (pages) made, shared
    evenly among ``readers`` (``RACE_READERS``). ``counted``: each page asks
    ``Prefer: count=exact``, and a count outside what the writes allow
    (``counted_wrong``) is wrong too.
    """
    import threading

    arrays = any(which.startswith("cs") for which in readers)
    declare(api, collection, {**INDEXES, **RACE_ARRAY_INDEXES} if arrays else INDEXES)
    stable = {
        f"s{n:03d}": {"id": f"s{n:03d}", "email": "hit@x", "customer": {"id": "c"}, "created": n} for n in range(40)
    }
    if arrays:  # half hold red (one twice), half do not
        for n, document in enumerate(stable.values()):
            document["tags"] = [["red", "blue", "red"], ["blue"]][n % 2]
    for doc_id, document in stable.items():
        put(api, collection, doc_id, document)
    churning = [f"w{n:03d}" for n in range(40)]
    stop = threading.Event()
    lock = threading.Lock()
    wrong = {"not matching": 0, "out of order": 0, "missing": 0, "failed": 0, "queries": 0, "writes": 0}
    wrong.update({"count wrong": 0, "counted": 0})
    why_wrong: List[str] = []  # each wrong count's reader and why, printed with the counts
    log = WriteLog()
    wrong.update({f"queries {which}": 0 for which in readers})

    def count(**counts: int) -> None:
        with lock:
            for name, added in counts.items():
                wrong[name.replace("_", " ")] += added

    def write(seed: int) -> None:
        rng = random.Random(seed)
        session = requests.Session()
        while not stop.is_set():
            doc_id = rng.choice(churning)
            document = {
                "id": doc_id,
                "email": rng.choice(["hit@x", "hi@x", "h@x", "hj@x", "miss@x"]),
                "customer": {"id": rng.choice(["c", "d", "e"])},
                "created": rng.uniform(-10, 40),
            }
            tags = rng.choice(RACE_TAGS) if arrays else None
            if tags is not None:
                document["tags"] = tags
            if rng.random() < 0.2:
                logged = log.sent(doc_id, None)
                session.delete(api.server.url(f"/v1/{collection}/{doc_id}"), headers=api.auth_header)
            else:
                logged = log.sent(doc_id, document)
                session.put(
                    api.server.url(f"/v1/{collection}/{doc_id}"),
                    data=json.dumps(document),
                    headers={**api.auth_header, "Content-Type": "application/json"},
                )
            log.answered(doc_id, logged)
            count(writes=1)

    def read(which: str, seed: int, quota: int) -> None:
        filters, matches, key, descending = RACE_READERS[which]
        rng = random.Random(seed)
        session = requests.Session()
        made = 0
        while made < quota:
            keys_seen, cursor, limit = [], None, rng.choice([3, 7, 50])
            resumed: Any = None  # the key the page goes on after: the cursor's
            headers = {**api.auth_header, **({"Prefer": "count=exact"} if counted else {})}
            while True:
                url = f"/v1/{collection}?{filters}&limit={limit}" + (f"&cursor={cursor}" if cursor else "")
                start = time.monotonic()
                answer = session.get(api.server.url(url), headers=headers)
                end = time.monotonic()
                made += 1
                count(queries=1, **{f"queries_{which}": 1})
                if answer.status_code != 200 or end - start > log.FORGET_AFTER:
                    count(failed=1)
                    break
                page = answer.json()
                count(not_matching=sum(not matches(document) for document in page["items"]))
                if counted:
                    # Before the page: at or before the last key answered (its cursor's), in the page's order.
                    before = passed(key, resumed, descending)
                    states = [[d] for d in stable.values()] + [log.states(w, start, end) for w in churning]
                    header = answer.headers.get("Content-Range", "")
                    why = counted_wrong(page, header, states, matches, before)
                    count(counted=1, count_wrong=int(bool(why)))
                    if why:
                        why_wrong.append(f"{which} after {resumed!r}: {why}")
                keys_seen += [key(document) for document in page["items"]]
                cursor = page["next"]
                # A list page's cursor is its last id read, which may be past its last document answered (one
                # deleted between its id's read and its body's); a query's is its last document's key.
                if which == "list" and cursor:
                    resumed = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
                elif keys_seen:
                    resumed = keys_seen[-1]
                if cursor is None:
                    break
            ordered = sorted(keys_seen, reverse=descending)
            count(out_of_order=int(keys_seen != ordered or len(set(keys_seen)) != len(keys_seen)))
            answered = set(keys_seen)
            count(missing=sum(matches(d) and key(d) not in answered for d in stable.values()))

    threads = [threading.Thread(target=write, args=(seed,)) for seed in range(2)]
    quota = -(-queries // len(readers))
    threads += [threading.Thread(target=read, args=(which, seed, quota)) for seed, which in enumerate(readers)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads[2:]:
            thread.join(timeout=600)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    if why_wrong:
        print("wrong counts:", *why_wrong[:20], sep="\n  ")
    return wrong


NOTHING_WRONG = {"not matching": 0, "out of order": 0, "missing": 0, "failed": 0}
NEW_READERS = ("in", "in-range", "in-below", "in-by-field", "like", "like-desc")
ARRAY_READERS = ("cs", "cs-range", "cs-below")


def wrong_answers(counts: Dict[str, int]) -> Dict[str, int]:
    return {name: counts[name] for name in ("not matching", "out of order", "missing", "failed")}


@pytest.mark.slow
def test_queries_racing_writers_answer_nothing_wrong(api) -> None:
    counts = race(api, "raced", 2_000)
    assert counts["queries"] >= 2_000 and counts["writes"] > 100, counts
    assert wrong_answers(counts) == NOTHING_WRONG, counts


def test_in_and_prefix_queries_racing_writers_answer_nothing_wrong(api) -> None:
    """in (alone, with a range either way, ordered by its own field) and like (either way) under writers; make
    test-slow runs 10,000 of them (issue 59)."""
    counts = race(api, "racedin", 900, NEW_READERS)
    assert counts["queries"] >= 900 and counts["writes"] > 50, counts
    assert wrong_answers(counts) == NOTHING_WRONG, counts


def test_array_member_queries_racing_writers_answer_nothing_wrong(api) -> None:
    """cs (alone, with a range either way) while writers move red into and out of documents' arrays, twice in
    some; make test-slow runs 10,000 of them (issue 59)."""
    counts = race(api, "racedcs", 450, ARRAY_READERS)
    assert counts["queries"] >= 450 and counts["writes"] > 25, counts
    assert wrong_answers(counts) == NOTHING_WRONG, counts


COUNTED_READERS = ("list", "eq", "order", "in", "in-range", "in-by-field", "like-desc", "cs", "cs-below")


def test_counted_queries_racing_writers_count_nothing_wrong(api) -> None:
    """Prefer: count=exact on queries of every operator and on the list, while writers move documents in and out
    of them: each page's Content-Range within what the writes allow (``counted_wrong``); make test-slow runs
    10,000 of them (issue 59)."""
    counts = race(api, "racedcount", 450, COUNTED_READERS, counted=True)
    assert counts["counted"] >= 450 and counts["writes"] > 25, counts
    assert {**wrong_answers(counts), "count wrong": counts["count wrong"]} == {**NOTHING_WRONG, "count wrong": 0}


def test_openapi_lists_a_collections_fields_and_orders(api) -> None:
    from openapi_spec_validator import validate

    declare(api, "typed")
    spec = api.get("/openapi.json").json()
    validate(spec)
    listing = spec["paths"]["/v1/typed"]["get"]
    named = {parameter.get("name"): parameter for parameter in listing["parameters"]}
    assert "/customer/id (string)" in named["customer"]["description"].replace("`", "")
    assert "created.desc" in named["order"]["schema"]["enum"]
    assert listing["operationId"] == "listTypedDocuments"


def test_openapi_types_a_fields_values_from_the_collections_schema(api) -> None:
    """Each pattern the document gives a query's values takes what the server takes, and refuses what it refuses."""
    schema = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "customer": {"type": "object", "properties": {"id": {"enum": ["C1", "C2"]}}},
            "created": {"type": "integer", "minimum": 0},
        },
    }
    settings = json.dumps({"schema": schema, "indexes": INDEXES}).encode()
    assert api.put_json("/v1/_collections/schemed", settings).status_code in (200, 201)
    time.sleep(0.2)
    put(api, "schemed", "a", {"email": "a@x.example", "customer": {"id": "C1"}, "created": 5})
    spec = api.get("/openapi.json").json()
    named = {p.get("name"): p for p in spec["paths"]["/v1/schemed"]["get"]["parameters"]}
    assert named["email"]["x-value-schema"] == {"type": "string", "format": "email"}
    assert named["created"]["x-value-schema"] == {"type": "integer", "minimum": 0}
    patterns = {
        name: re.compile(named[name]["schema"]["items"]["pattern"]) for name in ("email", "customer", "created")
    }
    for name, value, served in (
        ("created", "gte.5", 200),
        ("created", "gte.x", 400),
        ("customer", "eq.C1", 200),
        ("email", "eq.a@x.example", 200),
        ("created", "in.(5,6)", 200),
        ("created", "in.(5,x)", 400),
        ("customer", 'in.(C1,"C2")', 200),
        ("email", 'in.(a@x.example,"b,c")', 200),
        ("email", "in.()", 400),
        ("email", "like.a@*", 200),
        ("email", "like.a@", 400),
        ("email", "like.a*x*", 400),
        ("customer", "like.C*", 200),
        ("created", "like.5*", 400),
    ):
        assert bool(patterns[name].match(value)) == (served == 200), (name, value)
        assert api.get(f"/v1/schemed?{name}={quote(value)}").status_code == served, (name, value)
    # Narrower than the server, from the schema: a value the schema rules out matches no pattern.
    assert not patterns["customer"].match("eq.C3") and not patterns["created"].match("eq.5.5")


def test_indexes_declared_by_the_cli_are_built_and_dropped_by_the_workers(
    api, redis_server, redis_client, tmp_path
) -> None:
    """The CLI stores the settings and gives the shards their specs; its change's message makes a worker build
    a new index, and sweep a dropped one's fields from the documents."""
    from cache.indexes.declared import declared_indexes
    from tests.handlers.test_collection_settings import cli

    documents = orders(200, seed=3)
    for doc_id, document in documents.items():
        put(api, "bycli", doc_id, document)
    indexes = tmp_path / "indexes.json"
    indexes.write_text(json.dumps({"by_email": INDEXES["by_email"]}))
    made = cli(redis_server.url, "set", "bycli", "--indexes", str(indexes))
    assert made.returncode == 0, made.stderr
    # No query, no look at the settings: the change's message starts the build (cache/indexes/upkeep.py).
    states = [keys.index_states_key(b"bycli", shard) for shard in range(keys.INDEX_SHARDS)]
    until(lambda: all(redis_client.hvals(state) == [b"1"] for state in states), "built after the CLI's change")
    found = query_all(api, "bycli", "email=eq.user2@example.com")
    assert found == [d for _, d in sorted(documents.items()) if d["email"] == "user2@example.com"]
    assert index_fields(redis_client, "bycli", documents) == len(documents)
    index = declared_indexes({"by_email": INDEXES["by_email"]})[0]
    entries = [
        keys.index_entries_key(b"bycli", shard, b"by_email", index.version.encode())
        for shard in range(keys.INDEX_SHARDS)
    ]
    assert sum(redis_client.exists(key) for key in entries) == keys.INDEX_SHARDS
    indexes.write_text("{}")
    dropped = cli(redis_server.url, "set", "bycli", "--indexes", str(indexes))
    assert dropped.returncode == 0, dropped.stderr
    # Dropped: its entries at once, and its field in each document's hash by the sweep its message starts.
    assert sum(redis_client.exists(key) for key in entries) == 0
    until(lambda: index_fields(redis_client, "bycli", documents) == 0, "the dropped index's fields swept")
    swept = [keys.index_dropped_key(b"bycli", shard) for shard in range(keys.INDEX_SHARDS)]
    until(lambda: sum(redis_client.exists(key) for key in swept) == 0, "the sweep's own keys gone")
    assert api.get("/v1/bycli?email=eq.user2@example.com").json()["type"] == PROBLEM + "no-index"
    indexes.write_text('{"by email": {}}')
    refused = cli(redis_server.url, "set", "bycli", "--indexes", str(indexes))
    assert refused.returncode == 1 and "index name 'by email'" in refused.stderr


def index_fields(client, collection: str, documents: Dict[str, Any]) -> int:
    """How many index fields the hashes of ``documents`` hold (key by key: on a cluster too)."""
    hashes = [keys.document_key(collection.encode(), doc_id.encode()) for doc_id in documents]
    return sum(sum(1 for field in client.hkeys(key) if field.startswith(b"x:")) for key in hashes)


def until(condition, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {seconds} s"
        time.sleep(0.05)


def test_an_index_whose_specs_never_arrived_is_given_again_and_built(api, redis_client) -> None:
    """As if the worker that stored the settings died before every shard had the spec: queries repair it."""
    for n in range(50):
        put(api, "repaired", f"d{n}", {"email": f"{n % 5}@x"})
    declare(api, "repaired", {"by_email": INDEXES["by_email"]})
    redis_client.delete(*[keys.index_spec_key(b"repaired", shard) for shard in range(0, keys.INDEX_SHARDS, 2)])
    wait_built(api, "repaired", "email=eq.1@x")
    assert len(query_all(api, "repaired", "email=eq.1@x")) == 10


def test_a_query_reads_the_settings_again_before_it_answers_no_index(api, redis_client) -> None:
    """As if a query outran the message of an index declared through another worker (here it never comes: the
    settings are written by hand): the query reads the settings again, and the index is honoured at once."""
    from cache.collection_settings import NAMES_KEY, generation_key, settings_key

    put(api, "outrun", "d1", {"email": "a@x"})
    for _ in range(8):  # each worker remembers that the collection has no settings
        assert api.get("/v1/outrun?email=eq.a@x").json()["type"] == PROBLEM + "no-index"
    settings = json.dumps({"indexes": {"by_email": INDEXES["by_email"]}})
    redis_client.hset(settings_key(b"outrun"), mapping={"s": settings, "e": '"by-hand"'})
    redis_client.zadd(NAMES_KEY, {"outrun": 0})
    redis_client.incr(generation_key(b"outrun"))
    wait_built(api, "outrun", "email=eq.a@x")
    assert query_all(api, "outrun", "email=eq.a@x") == [{"email": "a@x"}]


@pytest.mark.slow
def test_ten_thousand_queries_racing_writers_answer_nothing_wrong(api) -> None:
    """Issue 47's count: 10,000 queries under writers (make test-slow; on the cluster, by hand with
    JETWAY_TEST_TOPOLOGY=cluster JETWAY_TEST_SLOW=1)."""
    counts = race(api, "raced10k", 10_000)
    print(f"race: {counts}")  # make test-slow runs with -rP: the counts go in its log
    assert counts["queries"] >= 10_000 and counts["writes"] > 1_000, counts
    assert wrong_answers(counts) == NOTHING_WRONG, counts


@pytest.mark.slow
def test_ten_thousand_in_and_prefix_queries_racing_writers_answer_nothing_wrong(api) -> None:
    """Issue 59's count: 10,000 queries with in and like under writers, shared evenly among ``NEW_READERS``
    (make test-slow; on the cluster, by hand with JETWAY_TEST_TOPOLOGY=cluster JETWAY_TEST_SLOW=1)."""
    counts = race(api, "racedin10k", 10_000, NEW_READERS)
    print(f"race: {counts}")  # make test-slow runs with -rP: the counts go in its log
    assert counts["queries"] >= 10_000 and counts["writes"] > 1_000, counts
    assert wrong_answers(counts) == NOTHING_WRONG, counts


@pytest.mark.slow
def test_ten_thousand_array_member_queries_racing_writers_answer_nothing_wrong(api) -> None:
    """Issue 59's count for array members: 10,000 cs queries under writers, shared evenly among ``ARRAY_READERS``
    (make test-slow; on the cluster, by hand with JETWAY_TEST_TOPOLOGY=cluster JETWAY_TEST_SLOW=1)."""
    counts = race(api, "racedcs10k", 10_000, ARRAY_READERS)
    print(f"race: {counts}")  # make test-slow runs with -rP: the counts go in its log
    assert counts["queries"] >= 10_000 and counts["writes"] > 1_000, counts
    assert wrong_answers(counts) == NOTHING_WRONG, counts


@pytest.mark.slow
@pytest.mark.timeout(900)  # each page's count checked against the writes' log in the test's own process
def test_ten_thousand_counted_queries_racing_writers_count_nothing_wrong(api) -> None:
    """Issue 59's count for counts: 10,000 counted pages under writers, shared evenly among ``COUNTED_READERS``
    (make test-slow; on the cluster, by hand with JETWAY_TEST_TOPOLOGY=cluster JETWAY_TEST_SLOW=1)."""
    counts = race(api, "racedcount10k", 10_000, COUNTED_READERS, counted=True)
    print(f"race: {counts}")  # make test-slow runs with -rP: the counts go in its log
    assert counts["counted"] >= 10_000 and counts["writes"] > 1_000, counts
    assert {**wrong_answers(counts), "count wrong": counts["count wrong"]} == {**NOTHING_WRONG, "count wrong": 0}


def test_one_worker_builds_an_index_while_its_lease_holds(api, redis_client) -> None:
    """A lease another holder keeps (a worker of another instance, say) keeps this deployment's workers off
    the build; once it is gone, the next look at the settings starts the build here."""
    from cache.indexes.declared import declared_indexes

    for n in range(200):
        put(api, "leased", f"d{n:03d}", {"email": f"{n % 4}@x"})
    index = declared_indexes({"by_email": INDEXES["by_email"]})[0]
    lease = keys.index_build_lease_key(b"leased", b"by_email", index.version.encode())
    redis_client.set(lease, b"another worker", ex=60)
    declare(api, "leased", {"by_email": INDEXES["by_email"]})
    time.sleep(1)
    assert api.get("/v1/leased?email=eq.1@x").status_code == 409
    assert api.get("/v1/_collections/leased").headers["Index-Builds"] == "by_email=0/16"  # every shard has some
    assert redis_client.get(lease) == b"another worker"
    redis_client.delete(lease)
    deadline = time.monotonic() + 30
    while api.get("/v1/_collections/leased").headers["Index-Builds"] != "by_email=16/16":
        assert time.monotonic() < deadline, "not built within 30 s of the lease's end"
        time.sleep(0.05)
    assert len(query_all(api, "leased", "email=eq.1@x")) == 50
    assert redis_client.get(lease) is None  # given up once built
