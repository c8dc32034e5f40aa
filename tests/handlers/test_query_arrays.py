"""Array fields over HTTP (issue #59): ``cs.{x}`` queries, the bound on elements, what an array field refuses.

Generated documents are written before the index is declared (so it is
built over them), then rewritten, emptied and deleted through PUT, POST's
batch and DELETE; every ``cs`` query, paged, answers what Python computes,
each document once.
"""

from __future__ import annotations

import json
import random
from typing import Any, Dict
from urllib.parse import quote

from cache.indexes.values import MAX_ARRAY_ENTRIES
from tests.handlers.test_queries import PROBLEM, declare, put, query_all, wait_built

TAGGED = {
    "by_tags": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string[]"}]},
    "by_nums_at": {
        "fields": [
            {"name": "nums", "pointer": "/nums", "type": "number[]"},
            {"name": "at", "pointer": "/at", "type": "number"},
        ]
    },
}
TAGS = ["red", "re", "a,b", "", "é"]


def holds(doc: Any, member: str, value: Any) -> bool:
    array = doc.get(member)
    return isinstance(array, list) and any(
        isinstance(element, str) == isinstance(value, str) and element == value
        for element in array
        if not isinstance(element, bool)
    )


def cs(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if text == "" or any(char in text for char in ',{}"\\'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return quote("cs.{" + text + "}")


def document(rng: random.Random) -> Dict[str, Any]:
    return {
        "tags": [rng.choice([*TAGS, 3]) for _ in range(rng.randrange(5))] if rng.random() < 0.9 else "red",
        "nums": [rng.choice([1, 2, 2.5, -1]) for _ in range(rng.randrange(4))],
        "at": rng.randrange(5),
    }


def check(api, docs: Dict[str, Any], rng: random.Random) -> None:
    for tag in [*TAGS, "none"]:
        wanted = [docs[d] for d in sorted(docs) if holds(docs[d], "tags", tag)]
        assert query_all(api, "tagged", f"tags={cs(tag)}", limit=rng.choice([1, 3, 100])) == wanted, tag
    for number in (1, 2.5, -1, 7):
        for direction in ("asc", "desc"):
            matching = sorted((docs[d]["at"], d) for d in docs if holds(docs[d], "nums", number))
            wanted = [docs[d] for _, d in (reversed(matching) if direction == "desc" else matching)]
            found = query_all(api, "tagged", f"nums={cs(number)}&order=at.{direction}", limit=rng.choice([1, 4]))
            assert found == wanted, (number, direction)


def test_cs_finds_the_documents_whose_array_holds_a_value_each_once(api) -> None:
    rng = random.Random(59)
    docs = {f"d{n:02d}": document(rng) for n in range(40)}
    docs["dup"] = {"tags": ["red", "red", "re"], "nums": [1, 1.0], "at": 1}
    for doc_id, doc in docs.items():
        put(api, "tagged", doc_id, doc)
    declare(api, "tagged", TAGGED)
    wait_built(api, "tagged", "tags=cs.%7Bred%7D")
    check(api, docs, rng)
    for _ in range(60):  # rewrites that change, empty or remove arrays; deletes
        doc_id = rng.choice(sorted(docs))
        if rng.random() < 0.2:
            assert api.delete(f"/v1/tagged/{doc_id}").status_code == 204
            del docs[doc_id]
        else:
            docs[doc_id] = document(rng) if rng.random() < 0.7 else {"at": 0}
            put(api, "tagged", doc_id, docs[doc_id])
    check(api, docs, rng)


def test_an_array_over_the_bound_is_a_422_naming_it(api) -> None:
    declare(api, "bounded", TAGGED)
    over = {"tags": [str(n) for n in range(MAX_ARRAY_ENTRIES + 1)]}
    answer = api.put_json("/v1/bounded/big", json.dumps(over).encode())
    assert answer.status_code == 422 and answer.json()["type"] == PROBLEM + "not-indexable", answer.text
    assert f"at most {MAX_ARRAY_ENTRIES} elements" in answer.json()["detail"]
    assert api.get("/v1/bounded/big").status_code == 404
    put(api, "bounded", "fits", {"tags": [str(n) for n in range(MAX_ARRAY_ENTRIES)]})
    assert query_all(api, "bounded", "tags=cs.%7B63%7D") == [{"tags": [str(n) for n in range(MAX_ARRAY_ENTRIES)]}]


def test_an_array_field_takes_cs_only_and_orders_nothing(api) -> None:
    declare(api, "only", TAGGED)
    for refused in ("tags=eq.red", "tags=cs.%7Ba,b%7D", "tags=cs.%7Bred%7D&order=tags.asc", "at=cs.%7B1%7D"):
        answer = api.get(f"/v1/only?{refused}")
        assert answer.status_code == 400 and answer.json()["type"] == PROBLEM + "invalid-query", refused
    # An index with an array field answers only cs on it: by_nums_at would meet each document once per element.
    answer = api.get("/v1/only?at=eq.1")
    assert answer.status_code == 400 and answer.json()["type"] == PROBLEM + "no-index"
