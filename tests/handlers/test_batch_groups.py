"""A batch's writes go to Redis as one script call per slot group, each write still answered as it would be alone.

``cache.batches.groups`` gathers a segment's puts and deletes into
``scripts.WRITE_MANY`` calls (one per slot on a cluster, one for all on one
Redis). These tests count the calls Redis ran (``INFO commandstats``, over
every node) and hold every promise of a single write inside a group: its
own condition, ETag, index entry, change-feed event, the hot cache, and an
error of one write that leaves its neighbours done.
"""

from __future__ import annotations

from typing import Dict, List

from cache.batches.groups import GROUP_WRITES
from cache.keys import INDEX_SHARDS, document_key, feed_key, index_key_for, shard_of
from tests.cache.test_hot_cache_api import WARM_READS, command_calls, fresh_get
from tests.handlers.test_batch import batch, problem_of, results
from tests.multinode import TOPOLOGY

# Script calls a request makes besides its writes' (the gate's, at most); a cluster's groups are its slots.
OTHER_CALLS = 3
# 100 puts: one call on one Redis (GROUP_WRITES of them fit one), one per slot on a cluster.
assert GROUP_WRITES >= 100
MOST_GROUPS = INDEX_SHARDS if TOPOLOGY == "cluster" else 1


def script_calls(redis_server) -> int:
    calls = command_calls(redis_server)
    return calls["cmdstat_evalsha"] + calls["cmdstat_eval"]


def feed_etags(redis_client, collection: bytes, doc_id: bytes) -> List[bytes]:
    """The ETags of the change-feed events of ``doc_id``, oldest first."""
    events = redis_client.xrange(feed_key(collection, shard_of(doc_id)))
    return [fields[b"e"] for _, fields in events if fields[b"i"] == doc_id]


def test_a_hundred_puts_are_a_few_script_calls_not_a_hundred(api, redis_server):
    operations = [{"op": "put", "collection": "groups", "id": f"g{n}", "document": {"n": n}} for n in range(100)]
    batch(api, {"op": "put", "collection": "groups", "id": "warm", "document": {}})  # scripts loaded, token known
    before = script_calls(redis_server)
    answer = results(batch(api, *operations))
    calls = script_calls(redis_server) - before
    assert [result["status"] for result in answer] == [201] * 100
    assert calls <= MOST_GROUPS + OTHER_CALLS, calls
    for n in (0, 57, 99):
        single = api.get(f"/v1/groups/g{n}")
        assert single.json() == {"n": n} and single.headers["ETag"] == answer[n]["etag"]


def test_a_failed_condition_in_a_group_leaves_its_neighbours_exact(api, redis_client):
    etags: Dict[str, str] = {}
    for n in range(8):
        etags[f"g{n}"] = api.put_json(f"/v1/groups/g{n}", b'{"v":1}').headers["ETag"]
        for _ in range(WARM_READS):  # held in the workers' hot caches: the batch must drop each entry
            fresh_get(api, f"/v1/groups/g{n}")
    operations = [
        {"op": "put", "collection": "groups", "id": f"g{n}", "document": {"v": 2}, "if_match": etags[f"g{n}"]}
        for n in range(8)
    ]
    operations[3]["if_match"] = '"stale"'
    operations[5] = {"op": "delete", "collection": "groups", "id": "g5", "if_match": etags["g5"]}
    operations.append({"op": "delete", "collection": "groups", "id": "missing"})
    operations.append({"op": "put", "collection": "groups", "id": "g9", "document": {"v": 9}, "ttl": 100})
    answer = results(batch(api, *operations))
    assert [result["status"] for result in answer] == [200, 200, 200, 412, 200, 204, 200, 200, 404, 201]
    assert problem_of(answer[3]) == "precondition-failed" and problem_of(answer[8]) == "not-found"
    for n in (0, 1, 2, 4, 6, 7):
        read = fresh_get(api, f"/v1/groups/g{n}")
        assert read.json() == {"v": 2} and read.headers["ETag"] == answer[n]["etag"]
        assert feed_etags(redis_client, b"groups", f"g{n}".encode())[-1] == answer[n]["etag"].encode()
    assert fresh_get(api, "/v1/groups/g3").headers["ETag"] == etags["g3"]
    assert len(feed_etags(redis_client, b"groups", b"g3")) == 1  # its first put's event alone
    assert fresh_get(api, "/v1/groups/g5").status_code == 404
    assert redis_client.zscore(index_key_for(b"groups", b"g5"), b"g5") is None
    assert feed_etags(redis_client, b"groups", b"g5")[-1] == b""  # a delete's event
    assert feed_etags(redis_client, b"groups", b"missing") == []
    assert redis_client.zscore(index_key_for(b"groups", b"g9"), b"g9") == 0
    assert 90 < redis_client.ttl(document_key(b"groups", b"g9")) <= 100


def test_a_get_between_writes_of_its_document_sees_the_earlier_one(api):
    answer = results(
        batch(
            api,
            {"op": "put", "collection": "groups", "id": "a", "document": {"v": 1}},
            {"op": "put", "collection": "groups", "id": "b", "document": {"v": 1}},
            {"op": "get", "collection": "groups", "id": "a"},
            {"op": "put", "collection": "groups", "id": "a", "document": {"v": 2}},
            {"op": "get", "collection": "groups", "id": "a"},
        )
    )
    assert [result.get("document") for result in answer[2:5:2]] == [{"v": 1}, {"v": 2}]
    assert api.get("/v1/groups/a").headers["ETag"] == answer[3]["etag"]


def test_a_redis_error_of_one_write_leaves_the_others_done(api, redis_client):
    redis_client.set(document_key(b"groups", b"odd"), b"not a hash")  # every write of it meets WRONGTYPE
    answer = results(
        batch(
            api,
            {"op": "put", "collection": "groups", "id": "x", "document": {"v": 1}},
            {"op": "put", "collection": "groups", "id": "odd", "document": {"v": 1}},
            {"op": "put", "collection": "groups", "id": "y", "document": {"v": 1}},
        )
    )
    assert answer[0]["status"] == answer[2]["status"] == 201
    assert answer[1]["status"] >= 500
    assert api.get("/v1/groups/x").json() == api.get("/v1/groups/y").json() == {"v": 1}
    assert feed_etags(redis_client, b"groups", b"odd") == []


def test_new_ids_join_the_id_index_once_a_shard_and_an_overwrite_leaves_it_alone(api, redis_server, redis_client):
    # A hash with an ETag has its id listed already: only a create adds one, a group's in one ZADD a shard.
    creates = [{"op": "put", "collection": "listed", "id": f"n{n}", "document": {"n": n}} for n in range(100)]
    batch(api, {"op": "put", "collection": "listed", "id": "warm", "document": {}})
    before = command_calls(redis_server)
    assert [result["status"] for result in results(batch(api, *creates))] == [201] * 100
    created = command_calls(redis_server) - before
    assert 0 < created["cmdstat_zadd"] <= INDEX_SHARDS, created
    before = command_calls(redis_server)
    assert [result["status"] for result in results(batch(api, *creates))] == [200] * 100
    assert api.put_json("/v1/listed/n7", b'{"n":"seven"}').status_code == 200
    assert (command_calls(redis_server) - before)["cmdstat_zadd"] == 0
    for n in range(100):
        assert redis_client.zscore(index_key_for(b"listed", f"n{n}".encode()), f"n{n}".encode()) == 0


def test_an_id_created_then_deleted_in_one_batch_is_not_listed(api, redis_client):
    def put(doc_id: str) -> dict:
        return {"op": "put", "collection": "listed", "id": doc_id, "document": {"id": doc_id}}

    def delete(doc_id: str) -> dict:
        return {"op": "delete", "collection": "listed", "id": doc_id}

    operations = [put("c1"), delete("c1"), put("c2"), put("c3"), delete("c3"), put("c3"), put("c4"), delete("c4")]
    answer = results(batch(api, *operations))
    assert [result["status"] for result in answer] == [201, 204, 201, 201, 204, 201, 201, 204]
    listed = {
        doc_id: redis_client.zscore(index_key_for(b"listed", doc_id), doc_id) for doc_id in (b"c1", b"c2", b"c3", b"c4")
    }
    assert listed == {b"c1": None, b"c2": 0, b"c3": 0, b"c4": None}
    assert api.get("/v1/listed/c1").status_code == 404 and api.get("/v1/listed/c3").json() == {"id": "c3"}
