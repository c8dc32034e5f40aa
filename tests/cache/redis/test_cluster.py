"""cache.redis.cluster: hash slots, and Jetway on a real 3-master Redis Cluster.

The slot arithmetic runs in every ``make test``. The rest starts its own
cluster and Jetway and runs only under ``make test-cluster``
(``JETWAY_TEST_TOPOLOGY`` set): slots moved behind Jetway's back (MOVED),
a slot caught mid-migration (ASK, TRYAGAIN), and ``redis-cli --cluster
reshard`` under a steady read and write load with no failed request and no
lost write.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
import requests
from cryptography.hazmat.primitives import serialization

from cache.keys import INDEX_SHARDS, document_key, index_key_for
from cache.redis.address import parse_redis_url
from cache.redis.slots import command_key, crc16, key_slot, redirection
from tests.cache.redis.test_redis_tls import make_ca, make_server_cert
from tests.multinode import TOPOLOGY, ClusterServers, TlsFiles
from tests.support import ClientThreads, JetwayServer, wait_until

JSON = {"Content-Type": "application/json"}
# Keys per document slot besides the documents, in the resharding test.
FILLER = 200
multinode = pytest.mark.skipif(TOPOLOGY == "single", reason="multi-node: run by make test-cluster")


# --- hash slots (no server) ----------------------------------------------------


def test_crc16_is_xmodem():
    assert crc16(b"123456789") == 0x31C3


@pytest.mark.parametrize(
    ("key", "slot"),
    # As a real Redis 7 answered CLUSTER KEYSLOT.
    [
        (b"foo", 12182),
        (b"{user1000}.following", 3443),
        (b"jw:{users:06}:d:u1", 10624),
        (b"jw:rl:{abc}", 7638),
        (b"{}x", 10595),  # an empty tag is no tag: the whole key counts
        (b"a{}{b}", 15033),  # only the first { ... } pair is looked at
    ],
)
def test_key_slot_matches_redis(key, slot):
    assert key_slot(key) == slot


def test_a_document_and_its_index_shard_are_in_one_slot():
    for doc_id in (b"a", b"u1", b"x" * 128):
        assert key_slot(document_key(b"users", doc_id)) == key_slot(index_key_for(b"users", doc_id))


def test_commands_are_routed_by_their_first_key():
    assert command_key((b"HMGET", b"jw:{a:01}:d:x", b"b")) == b"jw:{a:01}:d:x"
    assert command_key((b"EVALSHA", b"f" * 40, 2, b"k1", b"k2", b"arg")) == b"k1"
    assert command_key((b"evalsha", b"f" * 40, 0, b"arg")) is None
    assert command_key((b"PING",)) is None
    assert command_key((b"SCRIPT", b"LOAD", b"return 1")) is None


def test_redirections_name_slot_and_node():
    assert redirection("MOVED 3999 127.0.0.1:6381", ("10.0.0.1", 7000)) == (3999, ("127.0.0.1", 6381))
    assert redirection("ASK 12 ::1:7002", ("10.0.0.1", 7000)) == (12, ("::1", 7002))
    # An empty host means "the one you asked" (a node that does not know its address).
    assert redirection("MOVED 5 :7001", ("10.0.0.1", 7000)) == (5, ("10.0.0.1", 7001))


def test_group_urls():
    cluster = parse_redis_url("redis-cluster://:pw@10.0.0.1:7000,10.0.0.2,[::1]:7002")
    assert (cluster.kind, cluster.nodes, cluster.password) == (
        "cluster",
        (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002)),
        "pw",
    )
    assert "pw" not in cluster.describe()
    secure = parse_redis_url("rediss-cluster://n1:7000,n2:7001")
    assert (secure.tls, secure.ca_path, secure.at("n2", 7001).tls) == (True, None, True)
    assert "TLS" in secure.describe()
    sentinel = parse_redis_url("redis-sentinel://s1,s2:26380/mymaster?db=3")
    assert (sentinel.kind, sentinel.nodes, sentinel.service, sentinel.db) == (
        "sentinel",
        (("s1", 26379), ("s2", 26380)),
        "mymaster",
        3,
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis-sentinel://s1:26379", "names the master"),
        ("redis-cluster://h:7000/2", "only database 0"),
        ("redis-cluster://h:7000,h:port", "not a number"),
        ("redis-cluster://h:7000,", "is not a host"),
        ("redis-cluster://h:7000?ca=/etc/hostname", "is for rediss"),
        ("rediss-sentinel://s1/mymaster", "unsupported scheme"),
    ],
)
def test_bad_group_urls_say_what_is_wrong(url, message):
    with pytest.raises(ValueError, match=message):
        parse_redis_url(url)


# --- a real cluster -------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServers]:
    servers = ClusterServers(tmp_path_factory.mktemp("cluster"))
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def gateway(cluster: ClusterServers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JetwayServer]:
    server = JetwayServer(cluster.url, tmp_path_factory.mktemp("jetway-cluster") / "jetway.log")
    try:
        yield server.start()
    finally:
        server.stop()


def _put(gateway: JetwayServer, path: str, body: dict) -> requests.Response:
    return requests.put(gateway.url(path), data=json.dumps(body), headers=JSON, timeout=10)


def _owner(cluster: ClusterServers, key: bytes) -> int:
    """The port of the master that holds ``key``'s slot."""
    slot = key_slot(key)
    with cluster.nodes[0].client() as client:
        for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return master[1]
    raise AssertionError(f"slot {slot} is not served")


def _on(cluster: ClusterServers, port: int, *command: object) -> object:
    with next(node for node in cluster.nodes if node.port == port).client() as client:
        return client.execute_command(*command)


def _begin_move(cluster: ClusterServers, slot: int, source: int, target: int) -> None:
    """The first half of moving a slot by hand, as ``redis-cli --cluster reshard`` does."""
    ids = cluster.node_ids()
    _on(cluster, target, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
    _on(cluster, source, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])


def _migrate(cluster: ClusterServers, source: int, target: int, keys: List[bytes]) -> None:
    _on(cluster, source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)


def _end_move(cluster: ClusterServers, slot: int, target: int) -> None:
    """Move what is left of the slot (the shard's change-feed stream shares it), then hand it over, as reshard does."""
    ids = cluster.node_ids()
    for node in cluster.nodes:
        if node.port != target:
            left = _on(cluster, node.port, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if left:
                _migrate(cluster, node.port, target, list(left))
    for node in cluster.nodes:
        _on(cluster, node.port, "CLUSTER", "SETSLOT", slot, "NODE", ids[target])


def _other(cluster: ClusterServers, port: int) -> int:
    return next(node.port for node in cluster.nodes if node.port != port)


def _redirections(cluster: ClusterServers) -> Counter:
    """MOVED, ASK and TRYAGAIN replies the nodes have sent, and ASKING commands run (only Jetway sends those here)."""
    seen: Counter = Counter()
    for node in cluster.nodes:
        with node.client() as client:
            errors = client.info("errorstats")
            for kind in ("MOVED", "ASK", "TRYAGAIN"):
                seen[kind] += errors.get(f"errorstat_{kind}", {}).get("count", 0)
            seen["ASKING"] += client.info("commandstats").get("cmdstat_asking", {}).get("calls", 0)
    return seen


@multinode
def test_a_multi_get_spanning_every_node_comes_back_in_order(cluster, gateway):
    ids = [f"m{n}" for n in range(60)]
    for doc_id in ids:
        assert _put(gateway, f"/v1/spread/{doc_id}", {"id": doc_id}).status_code == 201
    assert len({_owner(cluster, document_key(b"spread", doc_id.encode())) for doc_id in ids}) == 3
    asked = [*random.sample(ids, 40), "missing"]
    response = requests.get(gateway.url("/v1/spread"), params={"ids": ",".join(asked)}, timeout=10)
    assert response.status_code == 200
    items = response.json()["items"]
    assert [item and item["id"] for item in items] == asked[:-1] + [None]
    listed = requests.get(gateway.url("/v1/spread?limit=1000"), timeout=10).json()["items"]
    assert [item["id"] for item in listed] == sorted(ids)


@multinode
def test_a_slot_moved_behind_jetways_back_is_followed(cluster, gateway):
    """MOVED: Jetway's map is stale, the node says where the slot went, the request still succeeds."""
    assert _put(gateway, "/v1/moving/d1", {"v": 1}).status_code == 201
    key, index = document_key(b"moving", b"d1"), index_key_for(b"moving", b"d1")
    source = _owner(cluster, key)
    target = _other(cluster, source)
    _begin_move(cluster, key_slot(key), source, target)
    _migrate(cluster, source, target, [key, index])
    _end_move(cluster, key_slot(key), target)

    before = _redirections(cluster)
    assert requests.get(gateway.url("/v1/moving/d1"), timeout=10).json() == {"v": 1}
    assert (_redirections(cluster) - before)["MOVED"] >= 1
    assert _put(gateway, "/v1/moving/d1", {"v": 2}).status_code == 200
    assert _owner(cluster, key) == target
    assert _on(cluster, target, "HGET", key, "b") == b'{"v": 2}'


@multinode
def test_the_hot_cache_follows_a_slot_moved_behind_jetways_back(cluster, gateway):
    """Cached by both workers, moved to another master, changed there: read back changed at once."""
    assert _put(gateway, "/v1/hotmove/d1", {"v": 1}).status_code == 201
    for _ in range(20):  # fresh connections: both workers cache it
        assert requests.get(gateway.url("/v1/hotmove/d1"), timeout=10).json() == {"v": 1}
    key, index = document_key(b"hotmove", b"d1"), index_key_for(b"hotmove", b"d1")
    source = _owner(cluster, key)
    target = _other(cluster, source)
    _begin_move(cluster, key_slot(key), source, target)
    _migrate(cluster, source, target, [key, index])
    _end_move(cluster, key_slot(key), target)
    _on(cluster, target, "HSET", key, "b", b'{"v": 2}', "e", b'"moved"')
    reads = [requests.get(gateway.url("/v1/hotmove/d1"), timeout=10) for _ in range(20)]
    assert [(read.json(), read.headers["ETag"]) for read in reads] == [({"v": 2}, '"moved"')] * 20


def _two_ids_in_one_shard(collection: bytes) -> Tuple[bytes, bytes]:
    seen: Dict[bytes, bytes] = {}
    for n in range(1000):
        doc_id = b"s%d" % n
        index = index_key_for(collection, doc_id)
        if index in seen:
            return seen[index], doc_id
        seen[index] = doc_id
    raise AssertionError("no two ids share a shard")


@multinode
def test_a_slot_caught_mid_migration_is_served_through_ask_and_tryagain(cluster, gateway):
    """ASK for a key already moved; TRYAGAIN (a script's keys split) retried until the move ends."""
    first, second = _two_ids_in_one_shard(b"migrating")
    for doc_id in (first, second):
        assert _put(gateway, f"/v1/migrating/{doc_id.decode()}", {"id": doc_id.decode()}).status_code == 201
    key = document_key(b"migrating", first)
    slot, source = key_slot(key), _owner(cluster, key)
    before = _redirections(cluster)
    target = _other(cluster, source)
    _begin_move(cluster, slot, source, target)
    _migrate(cluster, source, target, [key])  # only the first document so far

    # Each on its own side of the migration: ASK brings Jetway to the first.
    for doc_id in (first, second):
        response = requests.get(gateway.url(f"/v1/migrating/{doc_id.decode()}"), timeout=10)
        assert response.status_code == 200
        assert response.json() == {"id": doc_id.decode()}
    assert (_redirections(cluster) - before)["ASK"] >= 1
    assert (_redirections(cluster) - before)["ASKING"] >= 1

    # Deleting the first needs its document (moved) and the index (not yet):
    # TRYAGAIN until the rest of the slot has moved, a moment later.
    def finish() -> None:
        time.sleep(0.3)
        _migrate(cluster, source, target, [document_key(b"migrating", second), index_key_for(b"migrating", first)])
        _end_move(cluster, slot, target)

    finishing = threading.Thread(target=finish)
    finishing.start()
    started = time.monotonic()
    response = requests.delete(gateway.url(f"/v1/migrating/{first.decode()}"), timeout=10)
    finishing.join()
    assert response.status_code == 204
    assert time.monotonic() - started >= 0.3
    assert (_redirections(cluster) - before)["TRYAGAIN"] >= 1
    listed = requests.get(gateway.url("/v1/migrating"), timeout=10).json()["items"]
    assert listed == [{"id": second.decode()}]


@multinode
def test_no_write_runs_on_a_slot_while_it_migrates(cluster, gateway):
    """The keys a write's script derives (its index's sorted set, the feed's byte count) moved, its declared
    keys not yet: it waits for the move (TRYAGAIN) instead of failing half done (cache.redis.settled_slots)."""
    index = {"by_s": {"fields": [{"name": "s", "pointer": "/s", "type": "string"}]}}
    declared = _put(gateway, "/v1/_collections/settling", {"indexes": index})
    assert declared.status_code in (200, 201), declared.text
    time.sleep(0.2)  # each worker's settings cache hears of the index (tests/handlers/test_queries.py's declare)
    # Entries of 400 bytes: events over the budget's share of one, so the shard counts its feed's bytes (:fb).
    assert _put(gateway, "/v1/settling/d1", {"s": "a" * 400}).status_code == 201
    assert _put(gateway, "/v1/settling/d1", {"s": "b" * 400}).status_code == 200
    since = requests.get(gateway.url("/v1/_changes/settling"), timeout=10).json()["next"]
    key = document_key(b"settling", b"d1")
    slot, source = key_slot(key), _owner(cluster, key)
    target = _other(cluster, source)
    derived = [k for k in _on(cluster, source, "CLUSTER", "GETKEYSINSLOT", slot, 1000) if k.startswith(b"ji:")]
    assert any(b":x:by_s:" in k for k in derived) and any(k.endswith(b":fb") for k in derived), derived
    before = _redirections(cluster)
    _begin_move(cluster, slot, source, target)
    _migrate(cluster, source, target, derived)  # the document, its shard's id index and feed stay behind

    def finish() -> None:
        time.sleep(0.5)
        _end_move(cluster, slot, target)

    finishing = threading.Thread(target=finish)
    finishing.start()
    try:
        response = _put(gateway, "/v1/settling/d1", {"s": "c"})
    finally:
        finishing.join()
    assert response.status_code == 200, response.text
    assert (_redirections(cluster) - before)["TRYAGAIN"] >= 1
    # Written whole: the body, its index entry, its event.
    assert _on(cluster, target, "HGET", key, "b") == b'{"s": "c"}'
    for value, found in (("c", ["d1"]), ("b" * 400, [])):
        page = requests.get(gateway.url(f"/v1/settling?s=eq.{value}"), timeout=10).json()
        assert [item["s"] for item in page["items"]] == ["c"] * len(found), (value, page)
    events = requests.get(gateway.url(f"/v1/_changes/settling?since={since}"), timeout=10).json()["events"]
    assert [(event["op"], event["id"]) for event in events] == [("put", "d1")], events


class _Load(ClientThreads):
    """Writers and readers through Jetway; every acknowledged write and every failure kept."""

    COLLECTIONS = [f"load{n}" for n in range(8)]  # 128 hash tags, spread over every node

    def __init__(self, gateway: JetwayServer, threads: int = 4) -> None:
        super().__init__(threads)
        self.gateway = gateway
        self.written: Dict[Tuple[str, str], int] = {}  # (collection, id) -> last acknowledged version
        self.failures: List[str] = []
        self.requests = 0

    def run_client(self, number: int) -> None:
        mine: Dict[Tuple[str, str], int] = {}
        session = requests.Session()
        rng = random.Random(number)
        count = 0
        while not self.stopping.is_set():
            count += 1
            if mine and rng.random() < 0.5:
                self._read(session, rng.choice(sorted(mine)), mine)
                continue
            collection = rng.choice(self.COLLECTIONS)
            doc = (collection, f"w{number}-{count % 300}")  # new documents, then overwrites
            version = mine.get(doc, 0) + 1
            self._write(session, doc, version, mine)

    def _write(self, session: requests.Session, doc: Tuple[str, str], version: int, mine: Dict) -> None:
        response = self._call(session, "PUT", f"/v1/{doc[0]}/{doc[1]}", json.dumps({"v": version}))
        if response is not None and response.status_code in (200, 201):
            mine[doc] = version
            with self.lock:
                self.written[doc] = version
        elif response is not None:
            self._fail(f"PUT {doc}: {response.status_code} {response.text[:200]}")

    def _read(self, session: requests.Session, doc: Tuple[str, str], mine: Dict) -> None:
        response = self._call(session, "GET", f"/v1/{doc[0]}/{doc[1]}")
        if response is not None and (response.status_code != 200 or response.json() != {"v": mine[doc]}):
            self._fail(f"GET {doc}: {response.status_code} {response.text[:200]} (wrote v{mine[doc]})")

    def _call(self, session: requests.Session, method: str, path: str, body: str = "") -> requests.Response:
        with self.lock:
            self.requests += 1
        try:
            return session.request(method, self.gateway.url(path), data=body or None, headers=JSON, timeout=10)
        except requests.RequestException as error:
            self._fail(f"{method} {path}: {error}")
            return None

    def _fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


@multinode
def test_resharding_under_load_fails_no_request_and_loses_no_write(cluster, gateway):
    ids = cluster.node_ids()
    first, second, third = (node.port for node in cluster.nodes)
    _fill(cluster, _Load.COLLECTIONS)
    before = _redirections(cluster)
    started = time.monotonic()
    with _Load(gateway) as load:
        time.sleep(1.0)
        # Every slot of the first node to the second, then a third of them on to the third.
        for source, target, slots in ((first, second, 5461), (second, third, 2000)):
            moved = cluster.cli(
                "--cluster", "reshard", f"127.0.0.1:{source}",
                "--cluster-from", ids[source], "--cluster-to", ids[target],
                "--cluster-slots", str(slots), "--cluster-yes",
            )  # fmt: skip
            assert "Moving slot" in moved
        time.sleep(1.0)
    elapsed = time.monotonic() - started
    assert load.failures == [], load.failures[:20]
    assert load.requests > 200

    # No lost write: each document holds the last version acknowledged, read
    # back through Jetway and straight from the cluster.
    client = cluster.client()
    try:
        for (collection, doc_id), version in load.written.items():
            stored = client.hget(document_key(collection.encode(), doc_id.encode()), "b")
            assert json.loads(stored) == {"v": version}, (collection, doc_id)
        # Every worker serves the last version too (each has cached what its clients read).
        for (collection, doc_id), version in sorted(load.written.items())[:200]:
            for _ in range(4):
                read = requests.get(gateway.url(f"/v1/{collection}/{doc_id}"), timeout=10)
                assert read.json() == {"v": version}, (collection, doc_id)
        for collection in _Load.COLLECTIONS:
            listed = requests.get(gateway.url(f"/v1/{collection}?limit=1000"), timeout=10).json()["items"]
            expected = [load.written[collection, doc_id] for coll, doc_id in sorted(load.written) if coll == collection]
            assert [item["v"] for item in listed] == expected, collection
    finally:
        client.close()
    tagged = {key_slot(document_key(c.encode(), d.encode())) for c, d in load.written}
    seen = _redirections(cluster) - before
    assert seen["MOVED"] >= 1
    print(
        f"\nreshard under load: {load.requests} requests in {elapsed:.1f}s, {len(load.failures)} failed, "
        f"{len(load.written)} documents in {len(tagged)} slots, all intact; "
        f"Jetway was answered MOVED {seen['MOVED']}, ASK {seen['ASK']}, TRYAGAIN {seen['TRYAGAIN']} times"
    )


def _fill(cluster: ClusterServers, collections: List[str], per_slot: int = FILLER) -> None:
    """Keys beside the documents (same hash tags), so that each slot takes a while to migrate."""
    client = cluster.client()
    try:
        pipe = client.pipeline()
        for collection in collections:
            for shard in range(INDEX_SHARDS):
                for n in range(per_slot):
                    pipe.set(f"jw:{{{collection}:{shard:02x}}}:filler:{n}", "x" * 100)
        pipe.execute()
    finally:
        client.close()


@multinode
def test_the_token_caches_subscribe_on_another_node_when_theirs_dies(tmp_path):
    """A cluster forwards PUBLISH to every node; a subscriber whose node died moves on to the next seed."""
    servers = ClusterServers(tmp_path / "cluster")
    server = JetwayServer(servers.url, tmp_path / "jetway.log", auth=True)
    try:
        servers.start()
        server.start(["--workers", "2"])
        first, *others = servers.nodes  # every subscriber starts on the first seed
        wait_until(lambda: first.subscribers() == 2, 10, "both workers to subscribe on the first seed")
        first.kill()
        wait_until(lambda: sum(node.subscribers() for node in others) == 2, 10, "both to subscribe elsewhere")
    finally:
        server.stop()
        servers.stop()


def _tls_files(directory: Path) -> Tuple[TlsFiles, Path]:
    """A CA and a certificate for 127.0.0.1 it signed, and another CA's certificate.

    The nodes also present the certificate to each other on the cluster bus,
    which always checks it, so it is made for client use as well.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca("jetway cluster test CA")
    key, cert = make_server_cert(ca_key, ca_cert, client_too=True)
    _, rogue = make_ca("someone else's CA")
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (directory / "rogue.pem").write_bytes(rogue.public_bytes(pem))
    (directory / "server.pem").write_bytes(cert.public_bytes(pem))
    (directory / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key"), directory / "rogue.pem"


@multinode
def test_a_cluster_over_tls(tmp_path):
    """rediss-cluster:// (ElastiCache with in-transit encryption): every node verified against ?ca=."""
    files, rogue = _tls_files(tmp_path / "pki")
    servers = ClusterServers(tmp_path / "cluster", tls=files)
    gateway = JetwayServer(servers.url, tmp_path / "jetway.log", auth=True)
    distrustful = JetwayServer(servers.url.replace(str(files.ca), str(rogue)), tmp_path / "rogue.log")
    try:
        servers.start()
        token = gateway.make_token("tls", "admin")  # the keys CLI over TLS too
        gateway.start(["--workers", "1"])
        session = requests.Session()
        session.headers.update({**JSON, "Authorization": f"Bearer {token}"})
        ids = [f"t{n}" for n in range(30)]
        for doc_id in ids:
            assert session.put(gateway.url(f"/v1/secure/{doc_id}"), data=json.dumps({"id": doc_id})).status_code == 201
        items = session.get(gateway.url("/v1/secure"), params={"ids": ",".join(ids)}).json()["items"]
        assert [item["id"] for item in items] == ids
        assert sum(1 for node in servers.nodes if node.client().dbsize() > 0) == 3
        wait_until(lambda: servers.nodes[0].subscribers() == 1, 10, "the token cache to subscribe over TLS")

        distrustful.start(["--workers", "1"])
        assert requests.get(distrustful.url("/readyz"), timeout=10).status_code == 503
    finally:
        distrustful.stop()
        gateway.stop()
        servers.stop()
