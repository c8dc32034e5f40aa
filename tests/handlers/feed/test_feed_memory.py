"""What the change feed makes Redis hold, in bytes (issue #55 item 8; docs/limits.md).

Every event of a collection with indexes carries each index's entry, and
the one before where it changed (``cache.feed.live_queries``): with 8 indexes of
3 fields of 512-byte strings, ~26 KB an event. The feed's cap counts bytes
as well as events (``JETWAY_FEED_MAX_BYTES``, ``cache.documents.scripts``' trim_feed):
here 4 MiB a collection, 256 KiB a shard, and the writes below make ~8 MB
of events, every entry changed by each.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest
import requests

from tests.support import JetwayServer

JSON = {"Content-Type": "application/json"}
BUDGET = 4 * 1024 * 1024
FIELDS = [f"f{n}" for n in range(24)]
INDEXES = {
    f"i{n}": {"fields": [{"name": name, "pointer": f"/{name}", "type": "string"} for name in FIELDS[3 * n : 3 * n + 3]]}
    for n in range(8)
}


@pytest.fixture(scope="module")
def budgeted(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {"JETWAY_FEED_MAX_BYTES": str(BUDGET)}
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("budgeted") / "jetway.log", env)
    try:
        yield server.start()
    finally:
        server.stop()


def test_a_collections_feed_holds_at_most_its_byte_budget_and_each_event_at_most_the_stated_bound(
    budgeted, redis_client
) -> None:
    from cache import keys
    from cache.feed.streams import MAX_EVENT_BYTES

    declared = json.dumps({"indexes": INDEXES})
    answer = requests.put(budgeted.url("/v1/_collections/wide"), data=declared, headers=JSON, timeout=10)
    assert answer.status_code in (200, 201), answer.text
    for round_ in range(20):
        letter = "ab"[round_ % 2]
        document = {name: letter * 511 + name[-1] for name in FIELDS}
        operations = [{"op": "put", "collection": "wide", "id": f"d{n}", "document": document} for n in range(16)]
        body = json.dumps({"operations": operations})
        answer = requests.post(budgeted.url("/v1/_batch"), data=body, headers=JSON, timeout=30)
        assert answer.status_code == 200 and all(r["status"] in (200, 201) for r in answer.json()["results"])
    events = held = 0
    per_shard = BUDGET // keys.INDEX_SHARDS
    for shard in range(keys.INDEX_SHARDS):
        stream = keys.feed_key(b"wide", shard)
        length = redis_client.xlen(stream)
        if not length:
            continue
        used = redis_client.memory_usage(stream, samples=0)
        assert used <= length * MAX_EVENT_BYTES, (shard, used, length)
        assert used <= per_shard, (shard, used, per_shard)
        events, held = events + length, held + used
    assert 16 <= events < 320  # each shard trimmed to its budget, none emptied
    assert held <= BUDGET
    print(f"feed of 320 writes: {events} events kept, {held} bytes, {held / events:.0f} B an event")
