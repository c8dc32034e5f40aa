"""One write plan (cache/documents/write_plan.py): each way of writing a document obeys its collection's settings alike.

One matrix (settings, documents, TTLs) goes through PUT, POST, PATCH, a batch's put and an
import's line, and each write's outcome is read back from Redis: written or
its problem's type, the stored bytes, the expiry, the document's index
entries, and its change-feed event. The outcomes must be the same whichever
way the document was written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from cache import keys

SETTINGS = {
    "none": None,
    "ruled": {
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "max_bytes": 60,
        "ttl": 300,
        "indexes": {"by_n": {"fields": [{"name": "n", "pointer": "/n", "type": "number"}]}},
    },
}
DOCUMENTS = {
    "valid": {"n": 1, "s": "x"},
    "breaks-schema": {"n": "x"},
    "too-large": {"n": 1, "pad": "x" * 80},
}
TTLS = (None, 60)
ENTRIES = ("put", "post", "patch", "batch", "import")
PROBLEM = "urn:jetway:problem:"
Outcome = Tuple[Any, ...]
NOTHING: Outcome = (None, None, (), (0, False))  # no document, no expiry, no entries, no event


def compact(document: Dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def query(ttl: Optional[int]) -> str:
    return f"?ttl={ttl}" if ttl is not None else ""


def written_by(api, entry: str, collection: str, doc_id: str, document: Dict[str, Any], ttl: Optional[int]):
    """Write ``document`` by ``entry``; its id (a POST's is made by the server) and its result or problem type."""
    body = compact(document)
    if entry == "put":
        answer = api.put_json(f"/v1/{collection}/{doc_id}{query(ttl)}", body)
        return doc_id, outcome_of(answer.status_code, answer.json())
    if entry == "post":
        answer = api.post_json(f"/v1/{collection}{query(ttl)}", body)
        made = answer.headers.get("Location", "").rpartition("/")[2] or None
        return made, outcome_of(answer.status_code, answer.json())
    if entry == "patch":
        made = api.put_json(f"/v1/{collection}/{doc_id}", compact({"n": 0}))
        assert made.status_code == 201, made.text
        answer = api.patch_merge(f"/v1/{collection}/{doc_id}", body)
        return doc_id, outcome_of(answer.status_code, answer.json())
    if entry == "batch":
        operation = {"op": "put", "collection": collection, "id": doc_id, "document": document}
        if ttl is not None:
            operation["ttl"] = ttl
        result = api.post_json("/v1/_batch", compact({"operations": [operation]})).json()["results"][0]
        return doc_id, outcome_of(result["status"], result.get("problem", {}))
    line = b'{"id":"%s","doc":%s}\n' % (doc_id.encode(), body)
    answer = api.send(
        "POST", f"/v1/_import/{collection}?with_ids=1{query(ttl).replace('?', '&')}", line, "application/x-ndjson"
    )
    report = answer.json()
    if report["refusals"]:
        return doc_id, report["refusals"][0]["type"][len(PROBLEM) :]
    return doc_id, "written"


def outcome_of(status: int, body: Dict[str, Any]) -> str:
    return "written" if status in (200, 201) else body["type"][len(PROBLEM) :]


def stored(redis_client, collection: str, doc_id: Optional[str]) -> Outcome:
    """What Redis holds of the document: bytes, expiry (whole seconds, rounded up), index entries, feed events."""
    if doc_id is None:
        return NOTHING
    name, raw_id = collection.encode(), doc_id.encode()
    key = keys.document_key(name, raw_id)
    body, etag = redis_client.hmget(key, [b"b", b"e"])
    milliseconds = redis_client.pttl(key)
    expiry = None if milliseconds < 0 else -(-milliseconds // 60_000) * 60  # to the minute, up
    entries = sorted(
        member.replace(raw_id, b"ID")
        for index_key in redis_client.scan_iter(b"ji:{" + name + b":*")
        if redis_client.type(index_key) == b"zset"
        for member in redis_client.zrange(index_key, 0, -1)
        if member.endswith(raw_id)
    )
    events = redis_client.xrange(keys.feed_key(name, keys.shard_of(raw_id)))
    mine = [fields for _, fields in events if fields[b"i"] == raw_id]
    last_etag_matches = bool(mine) and mine[-1][b"e"] == etag
    return (body, expiry, tuple(entries), (len(mine), last_etag_matches))


def declare(api, collection: str, settings: Optional[Dict[str, Any]]) -> None:
    if settings is not None:
        answer = api.put_json(f"/v1/_collections/{collection}", json.dumps(settings).encode())
        assert answer.status_code in (200, 201), answer.text


@pytest.mark.parametrize("settings", sorted(SETTINGS))
def test_every_entry_point_writes_a_document_as_its_settings_say(api, redis_client, settings):
    outcomes: Dict[str, List[Outcome]] = {}
    for entry in ENTRIES:
        collection = f"plan-{settings}-{entry}"
        declare(api, collection, SETTINGS[settings])
        found = []
        for body_name, document in sorted(DOCUMENTS.items()):
            for ttl in TTLS if entry != "patch" else (None,):  # a PATCH takes no TTL: it keeps the expiry
                doc_id = f"{body_name}-{ttl}"
                made, result = written_by(api, entry, collection, doc_id, document, ttl)
                held = stored(redis_client, collection, made)
                if entry == "patch":
                    # What the PUT that made the document to patch did is not the patch's.
                    held = held[:3] + ((held[3][0] - 1, held[3][1]),) if result == "written" else NOTHING
                found.append((body_name, ttl, result, held))
        outcomes[entry] = found
    put = outcomes["put"]
    refused = {result for _, _, result, _ in put} - {"written"}
    assert refused == ({"schema-violation", "body-too-large"} if settings == "ruled" else set()), refused
    for entry in ("post", "batch", "import"):
        assert outcomes[entry] == put, entry
    assert outcomes["patch"] == [outcome for outcome in put if outcome[1] is None]


def test_collection_settings_reach_a_write_only_through_the_write_plan():
    """A rule applied outside the write plan would be a second copy, missing from the other entry points."""
    root = Path(__file__).resolve().parents[2]
    applied = re.compile(r"index_args\(|ttl_or_default\(|\.check\(value|\.write_replicas\b")
    outside = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("api", "handlers", "cache")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name not in ("write_plan.py", "collection_settings.py", "indexes.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if applied.search(line) and not line.lstrip().startswith(("def ", "#"))
    ]
    assert outside == []
