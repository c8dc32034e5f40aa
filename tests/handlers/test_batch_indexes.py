"""A batch's index changes (one WRITE_MANY call, cache/documents/scripts.py) leave exactly what its writes applied
one by one would: held to a Python model over generated batches whose writes touch the same documents again and
again (an entry added then removed, removed then added, a document deleted then written, an array's elements
changed), then to the sorted sets themselves: no entry left that no document holds, none missing. On one Redis
and the 3-master cluster (make test-cluster).
"""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List, Optional

from cache.indexes.declared import declared_indexes
from cache.indexes.values import entry, unpack_entries
from tests.handlers.test_queries import declare, query_all
from tests.handlers.test_query_arrays import cs

BATCHED = {
    "by_status": {"fields": [{"name": "status", "pointer": "/status", "type": "string"}]},
    "by_tags": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string[]"}]},
    "by_status_rank": {
        "fields": [
            {"name": "status", "pointer": "/status", "type": "string"},
            {"name": "rank", "pointer": "/rank", "type": "number"},
        ]
    },
}
STATUSES = ["open", "held", "done"]
TAGS = ["red", "blue", "green"]
IDS = [f"d{n}" for n in range(8)]


def generated_document(rng: random.Random) -> Dict[str, Any]:
    document: Dict[str, Any] = {"status": rng.choice(STATUSES), "rank": rng.randint(0, 3)}
    if rng.random() < 0.7:
        document["tags"] = [rng.choice(TAGS) for _ in range(rng.randint(0, 3))]
    return document


def index_members(redis_client, collection: bytes) -> Dict[str, set]:
    """Every member of each of the collection's index sorted sets, by index name."""
    found: Dict[str, set] = {}
    for key in redis_client.scan_iter(match=b"ji:{" + collection + b":*}:x:*", count=1000):
        name = key.split(b"}:x:", 1)[1].split(b":", 1)[0].decode()
        found.setdefault(name, set()).update(redis_client.zrange(key, 0, -1))
    return found


def expected_members(documents: Dict[str, Any]) -> Dict[str, set]:
    expected: Dict[str, set] = {}
    for index in declared_indexes(BATCHED):
        fields = [(field.tokens, field.type) for field in index.fields]
        members: set = set()
        for doc_id, document in documents.items():
            made: Optional[bytes] = entry(document, fields, doc_id.encode())
            if made is None:
                continue
            multi = any(field.type.endswith("[]") for field in index.fields)
            members.update(unpack_entries(made) if multi else [made])
        expected[index.name] = members
    return expected


def test_a_batchs_index_changes_are_those_of_its_writes_one_by_one(api, redis_client) -> None:
    declare(api, "batchidx", BATCHED)
    rng = random.Random(2026)
    documents: Dict[str, Any] = {}
    for _ in range(25):
        operations: List[Dict[str, Any]] = []
        for _ in range(rng.randint(1, 30)):
            doc_id = rng.choice(IDS)
            if rng.random() < 0.2:
                operations.append({"op": "delete", "collection": "batchidx", "id": doc_id})
                documents.pop(doc_id, None)
            else:
                document = generated_document(rng)
                operations.append({"op": "put", "collection": "batchidx", "id": doc_id, "document": document})
                documents[doc_id] = document
        answer = api.post_json("/v1/_batch", json.dumps({"operations": operations}).encode())
        assert answer.status_code == 200, answer.text
        assert all(result["status"] in (200, 201, 204, 404) for result in answer.json()["results"]), answer.text
        assert index_members(redis_client, b"batchidx") == {
            name: members for name, members in expected_members(documents).items() if members
        }
        for status in STATUSES:
            found = query_all(api, "batchidx", f"status=eq.{status}")
            assert len(found) == sum(document["status"] == status for document in documents.values())
        for tag in TAGS:
            found_tags = query_all(api, "batchidx", f"tags={cs(tag)}")
            assert len(found_tags) == sum(tag in document.get("tags", []) for document in documents.values())
