"""An exact count never counts a document past its expiry, whatever the sweeper's lag (cache/indexes/counts.py).

The sweeper is kept away by holding the collection's sweep lease in the test's
name: documents expire in Redis and stay in the indexes (as they do between
their expiry and the sweeper's next step). An estimated count includes them;
an exact one carries their expiries out first (their ``expire`` events in the
feed, once each) and counts the rest. A shard with more due than a count's
step is counted ``behind``, and the answer says ``estimated``.
On one Redis and the 3-master cluster (make test-cluster).
"""

from __future__ import annotations

import time
import zlib
from typing import Iterator, List

import pytest

from cache import keys
from cache.documents.expiry import SWEEP_NAME
from cache.indexes.counts import COUNT
from tests.handlers.test_expiry import feed_events
from tests.handlers.test_live_queries import STATUS, now
from tests.handlers.test_queries import declare, put


def held_away(redis_client, collection: str) -> Iterator[None]:
    """The collection's sweep lease held by the test: no worker sweeps it until it is let go."""
    lease = keys.index_build_lease_key(collection.encode(), SWEEP_NAME, b"")
    redis_client.set(lease, b"the test", px=120_000)
    try:
        yield
    finally:
        redis_client.delete(lease)


@pytest.fixture
def unswept(redis_client) -> Iterator[str]:
    yield from held_away(redis_client, "countexp")


def range_total(answer) -> int:
    assert answer.status_code == 200, answer.text
    return int(answer.headers["Content-Range"].rsplit("/", 1)[1])


def test_an_exact_count_carries_out_the_expiries_it_would_count(api, redis_client, unswept) -> None:
    declare(api, "countexp", STATUS)
    since = now(api, "countexp")
    # All in one shard, those without a TTL sorting first: a page of one reads only them (a page that met an
    # expired document's entry would carry its expiry out itself, as a count does).
    kept, expiring = ids_in_shard(5, 3, "a"), ids_in_shard(5, 5, "z")
    for doc_id in kept:
        put(api, "countexp", doc_id, {"status": "open"})
    for doc_id in expiring:
        answer = api.put_json(f"/v1/countexp/{doc_id}?ttl=1", b'{"status": "open"}')
        assert answer.status_code == 201, answer.text
    time.sleep(1.3)  # Redis's own expiry is exact to the ms: every z is gone as a hash, its entries left
    for path in ("/v1/countexp?status=eq.open&limit=1", "/v1/countexp?limit=1"):
        estimated = api.get(path, headers={"Prefer": "count=estimated"})
        assert range_total(estimated) == 8, path  # the unswept entries counted, as documented
        assert estimated.headers["Preference-Applied"] == "count=estimated"
    exact = api.get("/v1/countexp?status=eq.open&limit=1", headers={"Prefer": "count=exact"})
    assert range_total(exact) == 3
    assert exact.headers["Preference-Applied"] == "count=exact"
    assert exact.headers["Content-Range"] == "0-0/3"
    assert range_total(api.get("/v1/countexp?limit=1", headers={"Prefer": "count=estimated"})) == 3
    expired = [event["id"] for event in feed_events(api, "countexp", since) if event["op"] == "expire"]
    assert sorted(expired) == sorted(expiring)  # each once, logged by the count


def ids_in_shard(shard: int, count: int, prefix: str = "b") -> List[str]:
    """``count`` ids of ``shard``, each ``prefix`` and a number."""
    found: List[str] = []
    n = 0
    while len(found) < count:
        if zlib.crc32(f"{prefix}{n}".encode()) % keys.INDEX_SHARDS == shard:
            found.append(f"{prefix}{n}")
        n += 1
    return found


def test_a_shard_with_more_due_than_a_step_is_counted_behind(api, redis_client) -> None:
    """COUNT itself, asked to carry out 2 of a shard's 3 due expiries: the one left is counted, and it says so."""
    for _ in held_away(redis_client, "countbehind"):
        ids = ids_in_shard(3, 4)
        for doc_id in ids[:3]:
            assert api.put_json(f"/v1/countbehind/{doc_id}?ttl=1", b"{}").status_code == 201
        put(api, "countbehind", ids[3], {})
        time.sleep(1.3)
        id_index = keys.index_key(b"countbehind", 3)
        # No feed key: the expiries are carried out without events (as with JETWAY_FEED=off).
        answer = redis_client.eval(COUNT.source, 1, id_index, 2, b"", 0, b"-", b"+", b"", b"")
        assert answer == [b"behind", 2, 2]  # the one document left and the third, not yet carried out
        answer = redis_client.eval(COUNT.source, 1, id_index, 2, b"", 0, b"-", b"+", b"", b"")
        assert answer == [b"ok", 1, 1]
