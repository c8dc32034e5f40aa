"""A live query with a rare filter resumes where it was on a busy collection (issue #55 item 7).

Its stream's ``id:`` moves past the events it passes over (id-only events,
``handlers.feed.subscriber``), so after more than the feed's cap of other
writes a reconnect neither gets 410 ``feed-position-lost`` nor reads those
writes again. The server here keeps 1,600 events a collection (100 a shard,
Redis trimming by whole nodes of 100): 600 writes of one document are past
the cap of its shard.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest
import requests

from tests.sse_client import SseClient
from tests.support import JetwayServer

JSON = {"Content-Type": "application/json"}
STATUS = {"by_status": {"fields": [{"name": "status", "pointer": "/status", "type": "string"}]}}


@pytest.fixture(scope="module")
def capped(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    env = {"JETWAY_FEED_MAX_EVENTS": "1600"}
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("capped") / "jetway.log", env)
    try:
        yield server.start()
    finally:
        server.stop()


def put(server: JetwayServer, path: str, document: dict) -> None:
    assert requests.put(server.url(path), data=json.dumps(document).encode(), headers=JSON, timeout=10).ok


def open_stream(server: JetwayServer, query: str, **headers: str) -> SseClient:
    return SseClient(server.port, f"/v1/_changes/rare{query}", dict(headers))


@pytest.mark.slow
def test_a_rare_live_query_resumes_past_more_than_the_cap_of_other_writes_without_410_or_rereading(
    capped, redis_client
) -> None:
    declared = json.dumps({"indexes": STATUS})
    answer = requests.put(capped.url("/v1/_collections/rare"), data=declared, headers=JSON, timeout=10)
    assert answer.status_code in (200, 201), answer.text
    with open_stream(capped, "?status=eq.open") as client:
        assert client.next_event().name == "ready"
        put(capped, "/v1/rare/r1", {"status": "open"})
        own = client.next_event()
        assert own.json()["id"] == "r1"
        for n in range(600):
            put(capped, "/v1/rare/busy", {"status": "closed", "n": n})
        with pytest.raises(TimeoutError):  # none of those is its own: ids arrive, and nothing is dispatched
            client.next_event(timeout=1.5)
        assert client.id_only > 0
        last_id = client.last_id
    # From its last own event the shard's cap is past: what every reconnect got before its place moved on.
    with open_stream(capped, "?status=eq.open", **{"Last-Event-ID": own.id}) as stale:
        assert stale.response.status == 410
    with open_stream(capped, "?status=eq.open", **{"Last-Event-ID": last_id}) as client:
        assert client.response.status == 200 and client.next_event().name == "ready"
        put(capped, "/v1/rare/r2", {"status": "open"})
        assert client.next_event().json()["id"] == "r2"  # the first event after its place: nothing read again
