"""cache.indexes.expiry_scripts on the suite's redis-server: invariant I after generated writes, expiries carried out.

Invariant I (docs/design/expiry.md): every document hash with a TTL has its id
in the shard's ``xe`` scored with its ``PEXPIRETIME``, and ``xm`` holds its
entries in the indexes the shard lists; an id in ``xe`` without a hash is an
expiry not carried out yet. The writes go through ``cache.documents.scripts``
as the store calls them, with a feed; a document's expiry is made without
waiting by deleting its hash and setting its ``xe`` score in the past (what
Redis and time would have done), then carried out by ``EXPIRE_DUE`` or by a
write that recreates it.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any, Dict, List, Tuple

import pytest

from cache import keys
from cache.documents import scripts
from cache.feed.streams import FeedLog
from cache.indexes.declared import declared_indexes, spec_json
from cache.indexes.scripts import BUILD, SPEC
from cache.indexes.values import entry, is_multi, unpack_entries

COLL = b"ex"
FEED = FeedLog()
BY_STATUS = {"by_status": {"fields": [{"name": "status", "pointer": "/status", "type": "string"}]}}
BY_N = {"by_n": {"fields": [{"name": "n", "pointer": "/n", "type": "number"}]}}
BY_TAGS = {"by_tags": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string[]"}]}}
TWO = declared_indexes({**BY_STATUS, **BY_N})
THREE = declared_indexes({**BY_STATUS, **BY_N, **BY_TAGS})


def spec(client: Any, indexes: Any, generation: int) -> None:
    for shard in range(keys.INDEX_SHARDS):
        client.eval(SPEC.source, 1, keys.index_spec_key(COLL, shard), generation, spec_json(indexes))


def build(client: Any, indexes: Any) -> None:
    for index in indexes:
        for shard in range(keys.INDEX_SHARDS):
            done = 0
            while not done:
                step_keys = [keys.index_spec_key(COLL, shard), keys.index_key(COLL, shard)]
                done, _ = client.eval(BUILD.source, 2, *step_keys, index.name, index.version, 3, 1 << 20)


def put_args(doc_id: bytes, document: Any, ttl: bytes, op: bytes = b"put", if_match: bytes = b"") -> Tuple[list, list]:
    shard = keys.shard_of(doc_id)
    feed_keys, feed_args = FEED.script_parts(op, COLL, shard)
    body = json.dumps(document).encode()
    etag = b'"%d"' % random.getrandbits(48)
    args = [doc_id, body, etag, b"date", ttl, if_match, b"", 0, 0, b"", *feed_args]
    return [*keys.document_and_index_keys(COLL, doc_id, shard), *feed_keys], args


def put(client: Any, doc_id: bytes, document: Any, ttl: bytes, op: bytes = b"put") -> Any:
    script_keys, args = put_args(doc_id, document, ttl, op)
    return client.eval(scripts.PUT.source, len(script_keys), *script_keys, *args)


def delete_args(doc_id: bytes) -> Tuple[list, list]:
    shard = keys.shard_of(doc_id)
    feed_keys, feed_args = FEED.script_parts(b"delete", COLL, shard)
    return [*keys.document_and_index_keys(COLL, doc_id, shard), *feed_keys], [doc_id, b"", *feed_args]


def delete(client: Any, doc_id: bytes) -> Any:
    script_keys, args = delete_args(doc_id)
    return client.eval(scripts.DELETE.source, len(script_keys), *script_keys, *args)


def batch(client: Any, writes: List[Tuple[str, bytes, Any, bytes]]) -> Any:
    """One WRITE_MANY call of ('p', id, document, ttl) and ('d', id, None, b'') writes."""
    all_keys: List[bytes] = []
    args: List[Any] = [3]
    for kind, doc_id, document, ttl in writes:
        write_keys, write_args = put_args(doc_id, document, ttl) if kind == "p" else delete_args(doc_id)
        all_keys += write_keys
        args += [kind, len(write_args), *write_args]
    return client.eval(scripts.WRITE_MANY.source, len(all_keys), *all_keys, *args)


def tag(shard: int) -> bytes:
    return b"ji:{%s:%02x}:" % (COLL, shard)


def lapse(client: Any, doc_id: bytes) -> None:
    """The document's TTL runs out: Redis deletes its hash at its expiry, which xe holds, now made a past time."""
    shard = keys.shard_of(doc_id)
    assert client.zscore(tag(shard) + b"xe", doc_id) is not None
    client.delete(keys.document_key(COLL, doc_id))
    client.zadd(tag(shard) + b"xe", {doc_id: int(time.time() * 1000) - 5})


def expire_due(client: Any, shard: int, step: int = 4) -> List[int]:
    feed_keys, feed_args = FEED.script_parts(b"expire", COLL, shard)
    script_keys = [keys.index_key(COLL, shard), *feed_keys]
    return client.eval(scripts.EXPIRE_DUE.source, len(script_keys), *script_keys, step, *feed_args)


def sweep(client: Any) -> int:
    expired = 0
    for shard in range(keys.INDEX_SHARDS):
        while True:
            done, looked, _ = expire_due(client, shard)
            expired += done
            if looked < 4:
                break
    return expired


def check_invariant(client: Any, indexes: Any, expired: Dict[bytes, Dict[str, Any]]) -> None:
    """I holds in every shard; the indexes hold exactly the entries of the documents there and of those expired
    but not yet carried out (``expired``: by id, the document as it was)."""
    listed = [b"x:%s:%s" % (index.name.encode(), index.version.encode()) for index in indexes]
    for shard in range(keys.INDEX_SHARDS):
        xe = dict(client.zrange(tag(shard) + b"xe", 0, -1, withscores=True))
        xm = client.hgetall(tag(shard) + b"xm")
        ids = client.zrange(keys.index_key(COLL, shard), 0, -1)
        found: Dict[bytes, List[bytes]] = {field: [] for field in listed}
        for doc_id in ids:
            key = keys.document_key(COLL, doc_id)
            fields = client.hgetall(key)
            if not fields:
                assert doc_id in expired and doc_id in xe, doc_id
                for field, value in mirror(client, shard, doc_id):
                    if field in found:
                        found[field] += entries_of(field, value)
                continue
            at = client.pexpiretime(key)
            held = {field: value for field, value in fields.items() if field in listed}
            for field, value in held.items():
                found[field] += entries_of(field, value)
            if at > 0:
                assert xe.get(doc_id) == at, doc_id
                mirrored = {field: value for field, value in mirror(client, shard, doc_id) if field in listed}
                assert mirrored == held, doc_id
            else:
                assert doc_id not in xe and doc_id not in xm, doc_id
        assert set(xe) <= set(ids), "an id in xe is in the shard's id index until its expiry is carried out"
        assert set(xm) <= set(xe)
        for field in listed:
            name, version = field[2:].split(b":")
            stored = client.zrange(tag(shard) + b"x:" + name + b":" + version, 0, -1)
            assert sorted(stored) == sorted(set(found[field])), (shard, field)


_UNPACK = "local p = redis.call('HGET', KEYS[1], ARGV[1]) if not p then return {} end return cmsgpack.unpack(p)"


def mirror(client: Any, shard: int, doc_id: bytes) -> List[Tuple[bytes, bytes]]:
    """A document's mirrored entries (xm), as (field, entry) pairs."""
    flat = client.eval(_UNPACK, 1, tag(shard) + b"xm", doc_id)
    return list(zip(flat[::2], flat[1::2]))


def entries_of(field: bytes, value: bytes) -> List[bytes]:
    return list(unpack_entries(value)) if is_multi(field) else [value]


def feed_events(client: Any) -> List[Tuple[bytes, bytes, Dict[bytes, bytes]]]:
    events = []
    for shard in range(keys.INDEX_SHARDS):
        for stream_id, fields in client.xrange(keys.feed_key(COLL, shard)):
            events.append((stream_id, fields[b"o"], fields))
    return events


def document(rng: random.Random) -> Dict[str, Any]:
    made: Dict[str, Any] = {"status": rng.choice(["open", "held", "done"]), "n": rng.randrange(5)}
    if rng.random() < 0.7:
        made["tags"] = rng.sample(["red", "blue", "green"], rng.randrange(3))
    if rng.random() < 0.1:
        made["status"] = 7  # in no status entry
    return made


@pytest.mark.parametrize("seed", range(6))
def test_generated_writes_keep_invariant_i_and_every_expiry_is_carried_out_once(redis_client, seed: int) -> None:
    """PUT with and without a TTL, patches keeping it, deletes, expiries carried out by the sweep or by a recreate,
    batches, a build over documents with TTLs and an index dropped then declared again: I holds after each, and
    each expiry is one ``expire`` event carrying the entries it removed, before the recreate's own event."""
    rng = random.Random(seed)
    client = redis_client
    indexes = TWO
    generation = 1
    spec(client, indexes, generation)
    live: Dict[bytes, Dict[str, Any]] = {}
    ttl_of: Dict[bytes, bool] = {}
    expired: Dict[bytes, Dict[str, Any]] = {}
    carried: List[bytes] = []  # ids whose expiry was carried out, in order per id
    for _ in range(160):
        doc_id = b"d%d" % rng.randrange(24)
        roll = rng.random()
        if roll < 0.35:
            made, ttl = document(rng), rng.choice([b"0", b"0", b"600", b"900"])
            if doc_id in expired:
                carried.append(doc_id)
                del expired[doc_id]
            put(client, doc_id, made, ttl)
            live[doc_id], ttl_of[doc_id] = made, ttl != b"0"
        elif roll < 0.5 and doc_id in live:
            made = document(rng)
            put(client, doc_id, made, b"", op=b"patch")  # keeps the expiry
            live[doc_id] = made
        elif roll < 0.6 and doc_id in live:
            assert delete(client, doc_id) == 1
            del live[doc_id]
        elif roll < 0.75 and doc_id in live and ttl_of[doc_id]:
            lapse(client, doc_id)
            expired[doc_id] = live.pop(doc_id)
        elif roll < 0.8:
            carried += sorted(expired)
            assert sweep(client) == len(expired)
            expired.clear()
        elif roll < 0.88:
            writes = []
            for other in rng.sample(range(24), 4):
                other_id = b"d%d" % other
                if other_id in live and rng.random() < 0.3:
                    writes.append(("d", other_id, None, b""))
                    del live[other_id]
                else:
                    made, ttl = document(rng), rng.choice([b"0", b"700"])
                    writes.append(("p", other_id, made, ttl))
                    if other_id in expired:
                        carried.append(other_id)
                        del expired[other_id]
                    live[other_id], ttl_of[other_id] = made, ttl != b"0"
            assert all(not isinstance(answer, list) or answer[0] != b"err" for answer in batch(client, writes))
        elif roll < 0.93:
            # A new index over the documents there (with and without TTLs): the build mirrors their entries.
            generation += 1
            indexes = THREE if indexes is TWO else TWO
            spec(client, indexes, generation)
            build(client, indexes)
        else:
            # by_n dropped, then declared again: its entries are built anew, its mirrors refreshed.
            generation += 2
            spec(client, declared_indexes(BY_STATUS), generation - 1)
            spec(client, indexes, generation)
            build(client, indexes)
        check_invariant(client, indexes, expired)
    carried += sorted(expired)
    sweep(client)
    check_invariant(client, indexes, {})
    # Every index holds exactly the live documents' entries.
    for index in indexes:
        fields = [(field.tokens, field.type) for field in index.fields]
        field_name = b"x:%s:%s" % (index.name.encode(), index.version.encode())
        want = sorted(
            one
            for doc_id, made in live.items()
            for one in entries_of(field_name, entry(made, fields, doc_id) or b"")
            if one
        )
        got = sorted(
            member
            for shard in range(keys.INDEX_SHARDS)
            for member in client.zrange(
                keys.index_entries_key(COLL, shard, index.name.encode(), index.version.encode()), 0, -1
            )
        )
        assert got == want, index.name
    ids = {doc_id for shard in range(16) for doc_id in client.zrange(keys.index_key(COLL, shard), 0, -1)}
    assert ids == set(live)
    # One expire event per expiry carried out, each before any later event of its id.
    events = feed_events(client)
    assert sorted(fields[b"i"] for _, op, fields in events if op == b"expire") == sorted(carried)
    for doc_id in set(carried):
        ops = [op for _, op, fields in events if fields[b"i"] == doc_id]
        for at, op in enumerate(ops):
            if op == b"expire":
                assert at + 1 == len(ops) or ops[at + 1] in (b"put", b"create"), ops


def test_a_recreate_after_expiry_logs_expire_then_the_write_and_leaves_no_stale_entry(redis_client) -> None:
    spec(redis_client, TWO, 1)
    put(redis_client, b"a", {"status": "open", "n": 1}, b"600", op=b"create")
    lapse(redis_client, b"a")
    put(redis_client, b"a", {"status": "done", "n": 2}, b"0", op=b"create")
    ops = [(op, fields) for _, op, fields in feed_events(redis_client)]
    assert [op for op, _ in ops] == [b"create", b"expire", b"create"]
    expire = ops[1][1]
    status = next(index for index in TWO if index.name == "by_status")
    field = b"w:by_status:" + status.version.encode()
    assert expire[field] == entry({"status": "open"}, [(("status",), "string")], b"a")
    assert expire[b"e"] == b"" and int(expire[b"t"]) > 0
    check_invariant(redis_client, TWO, {})
    assert sweep(redis_client) == 0  # carried out once


def test_if_match_on_an_expired_document_writes_nothing(redis_client) -> None:
    put(redis_client, b"a", {"status": "open"}, b"600")
    lapse(redis_client, b"a")
    script_keys, args = put_args(b"a", {"status": "x"}, b"0", if_match=b"*")
    assert redis_client.eval(scripts.PUT.source, len(script_keys), *script_keys, *args) == 0
    assert [op for _, op, _ in feed_events(redis_client)] == [b"put"]
    assert sweep(redis_client) == 1


@pytest.mark.parametrize("clearing", ["put", "delete"])
def test_a_put_without_ttl_or_a_delete_clears_the_expiry_record(redis_client, clearing: str) -> None:
    spec(redis_client, TWO, 1)
    put(redis_client, b"a", {"status": "open"}, b"600")
    xe, xm = tag(keys.shard_of(b"a")) + b"xe", tag(keys.shard_of(b"a")) + b"xm"
    assert redis_client.zscore(xe, b"a") and redis_client.hexists(xm, b"a")
    if clearing == "put":
        put(redis_client, b"a", {"status": "open"}, b"0")
    else:
        delete(redis_client, b"a")
    assert redis_client.zscore(xe, b"a") is None and not redis_client.hexists(xm, b"a")


def test_a_hash_given_a_later_expiry_is_rescored_not_expired(redis_client) -> None:
    """An id due in xe whose hash is still there (its expiry changed outside the scripts) is scored again."""
    put(redis_client, b"a", {"status": "open"}, b"600")
    xe = tag(keys.shard_of(b"a")) + b"xe"
    redis_client.zadd(xe, {b"a": 1})
    assert expire_due(redis_client, keys.shard_of(b"a"))[:2] == [0, 1]
    assert redis_client.zscore(xe, b"a") == redis_client.pexpiretime(keys.document_key(COLL, b"a"))
    redis_client.persist(keys.document_key(COLL, b"a"))
    redis_client.zadd(xe, {b"a": 1})
    expire_due(redis_client, keys.shard_of(b"a"))
    assert redis_client.zscore(xe, b"a") is None


def test_a_real_ttl_is_carried_out_once_it_ran_out(redis_client) -> None:
    """With Redis's own clock: not before the TTL ran out, and once after."""
    spec(redis_client, TWO, 1)
    put(redis_client, b"a", {"status": "open"}, b"1")
    shard = keys.shard_of(b"a")
    assert expire_due(redis_client, shard)[0] == 0
    at = redis_client.pexpiretime(keys.document_key(COLL, b"a"))
    while redis_client.time()[0] * 1000 + redis_client.time()[1] // 1000 <= at:
        time.sleep(0.05)
    assert expire_due(redis_client, shard)[:2] == [1, 1]
    assert redis_client.zcard(keys.index_key(COLL, shard)) == 0
    assert [op for _, op, _ in feed_events(redis_client)] == [b"put", b"expire"]
    check_invariant(redis_client, TWO, {})
