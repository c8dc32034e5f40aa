"""What the expiry tests share (tests/process/test_expiry_takeover.py, tests/cache/redis/test_expiry_failover.py):
documents written to expire into an indexed collection, and the events Redis's streams hold for them."""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import requests

from cache import keys

BY_STATUS = {"indexes": {"by_status": {"fields": [{"name": "status", "pointer": "/status", "type": "string"}]}}}


def write_expiring(url: Callable[[str], str], collection: bytes, ids: Sequence[str], ttl: int) -> None:
    """``collection`` indexed by status, then ``ids`` written with ``ttl`` in batches of 100 (``url``: the server's)."""
    answer = requests.put(url(f"/v1/_collections/{collection.decode()}"), json=BY_STATUS, timeout=10)
    assert answer.status_code in (200, 201), answer.text
    for at in range(0, len(ids), 100):
        operations = [
            {"op": "put", "collection": collection.decode(), "id": doc_id, "document": {"status": "open"}, "ttl": ttl}
            for doc_id in ids[at : at + 100]
        ]
        answer = requests.post(url("/v1/_batch"), json={"operations": operations}, timeout=30)
        assert answer.status_code == 200, answer.text


def events(client, collection: bytes, op: bytes) -> Dict[bytes, List[int]]:
    """Each document's ``op`` events' stream times (ms, Redis's clock) in ``collection``'s streams."""
    found: Dict[bytes, List[int]] = {}
    for shard in range(keys.INDEX_SHARDS):
        for stream_id, fields in client.xrange(keys.feed_key(collection, shard)):
            if fields[b"o"] == op:
                found.setdefault(fields[b"i"], []).append(int(stream_id.split(b"-")[0]))
    return found


def redis_ms(client) -> int:
    """Redis's clock, ms."""
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000
