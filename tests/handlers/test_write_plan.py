"""One write plan (cache/documents/write_plan.py): each way of writing a document obeys its collection's settings alike.

One matrix (settings, documents, TTLs, conditions) goes through PUT, POST,
PATCH, a batch's put and patch and an import's line, and each write's
outcome is read back from Redis: written or its problem's type, the stored
bytes, the expiry, the document's index entries, and its change-feed events
(how many the write added, and whether the last one carries the stored
ETag). The outcomes must be the same whichever way the document was written.

The conditions are a write's preconditions: none; ``If-Match`` with the
document's current ETag (passes) or with a stale one, an earlier version's
(412); ``If-None-Match: *`` on an existing document (412) or a missing one
(passes). Each goes only through the entry points that can carry it: a PUT
and a batch's put take both (headers; ``if_match`` and ``if_none_match``
members), a PATCH and a batch's patch take ``If-Match`` alone
(handlers/batch.py ``_FIELDS``). A POST creates under an id the server makes
and an import's line carries no conditions of its own: those two are held
to the unconditional column only. A condition on an existing document finds
one a plain PUT of ``{"n": 0}`` made (then one of ``{"n": -1}`` for a stale
tag; a PATCH always patches such a document), and a refused write must leave
it exactly as it was. A PUT's body is judged by the settings before its
condition (a 422 or 413 wins over the 412), a patch's merged document only
once its condition has passed: a PATCH is held to a PUT's outcome where the
two find the same document, and to its stored state where their problems differ.
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
# Each condition: whether the document exists before the write, and the precondition the write carries.
CONDITIONS = {
    "none": (False, None),
    "if-match-current": (True, ("if_match", "current")),
    "if-match-stale": (True, ("if_match", "stale")),
    "if-none-match-existing": (True, ("if_none_match", "*")),
    "if-none-match-missing": (False, ("if_none_match", "*")),
}
REFUSING = ("if-match-stale", "if-none-match-existing")  # 412 precondition-failed
# The entry points, and the conditions each can carry.
ENTRIES = {
    "put": tuple(CONDITIONS),
    "post": ("none",),
    "patch": ("none", "if-match-current", "if-match-stale"),
    "batch": tuple(CONDITIONS),  # a batch's put
    "batch-patch": ("none", "if-match-current", "if-match-stale"),
    "import": ("none",),
}
PATCHES = ("patch", "batch-patch")
HEADERS = {"if_match": "If-Match", "if_none_match": "If-None-Match"}
PROBLEM = "urn:jetway:problem:"
Outcome = Tuple[Any, ...]
NOTHING: Outcome = (None, None, (), (0, False))  # no document, no expiry, no entries, no event


def compact(document: Dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def query(ttl: Optional[int]) -> str:
    return f"?ttl={ttl}" if ttl is not None else ""


def prepared(api, collection: str, doc_id: str, entry: str, condition: str) -> Optional[Tuple[str, str]]:
    """Make the document the write finds (a plain PUT's, two for a stale tag); the precondition: member and value."""
    exists, precondition = CONDITIONS[condition]
    versions = 2 if condition == "if-match-stale" else 1 if exists or entry in PATCHES else 0
    tags = []
    for version in range(versions):
        made = api.put_json(f"/v1/{collection}/{doc_id}", compact({"n": -version}))
        assert made.status_code in (200, 201), made.text
        tags.append(made.headers["ETag"])
    if precondition is None:
        return None
    name, value = precondition
    return name, {"current": tags[-1:], "stale": tags[:1]}.get(value, [value])[0]


def written_by(
    api,
    entry: str,
    collection: str,
    doc_id: str,
    document: Dict[str, Any],
    ttl: Optional[int],
    precondition: Optional[Tuple[str, str]],
):
    """Write ``document`` by ``entry``; its id (a POST's is made by the server) and its result or problem type."""
    body = compact(document)
    headers = {HEADERS[precondition[0]]: precondition[1]} if precondition else {}
    if entry == "put":
        answer = api.put_json(f"/v1/{collection}/{doc_id}{query(ttl)}", body, headers=headers)
        return doc_id, outcome_of(answer.status_code, answer.json())
    if entry == "post":
        answer = api.post_json(f"/v1/{collection}{query(ttl)}", body)
        made = answer.headers.get("Location", "").rpartition("/")[2] or None
        return made, outcome_of(answer.status_code, answer.json())
    if entry == "patch":
        answer = api.patch_merge(f"/v1/{collection}/{doc_id}", body, headers=headers)
        return doc_id, outcome_of(answer.status_code, answer.json())
    if entry in ("batch", "batch-patch"):
        if entry == "batch":
            operation = {"op": "put", "collection": collection, "id": doc_id, "document": document}
        else:
            operation = {"op": "patch", "collection": collection, "id": doc_id, "patch": document}
        if ttl is not None:
            operation["ttl"] = ttl
        if precondition:
            operation[precondition[0]] = precondition[1]
        result = api.post_json("/v1/_batch", compact({"operations": [operation]})).json()["results"][0]
        return doc_id, outcome_of(result["status"], result.get("problem", {}))
    assert precondition is None  # an import's line carries none
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


def column(api, redis_client, settings: str, entry: str, condition: str) -> List[Outcome]:
    """Each document and TTL written by ``entry`` under ``condition``: (document, TTL, result, what Redis holds).

    The events held are those the write added (not the PUTs that made the
    document it found), and a refused write must leave what it found as it was.
    """
    collection = f"plan-{settings}-{entry}-{condition}"
    declare(api, collection, SETTINGS[settings])
    found = []
    for body_name, document in sorted(DOCUMENTS.items()):
        for ttl in TTLS if entry not in PATCHES else (None,):  # a patch takes no TTL: it keeps the expiry
            doc_id = f"{body_name}-{ttl}"
            precondition = prepared(api, collection, doc_id, entry, condition)
            before = stored(redis_client, collection, doc_id)
            made, result = written_by(api, entry, collection, doc_id, document, ttl, precondition)
            held = stored(redis_client, collection, made)
            if result != "written":
                assert held == before, (entry, condition, body_name, ttl, result)
            held = held[:3] + ((held[3][0] - before[3][0], held[3][1]),)
            found.append((body_name, ttl, result, held))
    return found


def expected(settings: str, body_name: str, condition: str, patch: bool) -> str:
    """A write's result: a PUT's body is judged before its condition, a patch's merged document after it."""
    refused = {"breaks-schema": "schema-violation", "too-large": "body-too-large"} if settings == "ruled" else {}
    judged = refused.get(body_name, "written")
    if condition not in REFUSING:
        return judged
    return "precondition-failed" if patch or judged == "written" else judged


@pytest.mark.parametrize("settings", sorted(SETTINGS))
def test_every_entry_point_writes_a_document_as_its_settings_and_conditions_say(api, redis_client, settings):
    outcomes = {
        (entry, condition): column(api, redis_client, settings, entry, condition)
        for entry, conditions in ENTRIES.items()
        for condition in conditions
    }
    for (entry, condition), found in outcomes.items():
        results = [result for _, _, result, _ in found]
        assert results == [expected(settings, row[0], condition, entry in PATCHES) for row in found], (entry, condition)
    for entry, conditions in ENTRIES.items():
        alike = "patch" if entry in PATCHES else "put"
        for condition in conditions:
            assert outcomes[entry, condition] == outcomes[alike, condition], (entry, condition)
    # A patch and a PUT with no TTL that find the same document leave the same.
    put = {condition: [row for row in outcomes["put", condition] if row[1] is None] for condition in CONDITIONS}
    assert outcomes["patch", "none"] == put["if-match-current"]
    assert outcomes["patch", "if-match-current"] == put["if-match-current"]
    # A stale tag: refused by both, the PUT for its body first where its body is refused.
    assert [row[:2] + row[3:] for row in outcomes["patch", "if-match-stale"]] == [
        row[:2] + row[3:] for row in put["if-match-stale"]
    ]


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
