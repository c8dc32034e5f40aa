"""The hot cache through real HTTP: what a cached read costs Redis, and every way a document can change.

The session's Jetway runs with the cache on (its default); every GET here
goes on a fresh connection, so the reads spread over both workers. A
document is read ``WARM_READS`` times first, so that each worker has it
cached (a worker caches a key on its second miss).
"""

from __future__ import annotations

import gzip
from collections import Counter
from typing import Callable, Dict, List

import pytest
import requests

from cache.keys import document_key
from tests.support import JetwayServer, wait_until

WARM_READS = 40
# Background commands that are no request's doing: the invalidation
# connections' PINGs, sentinels, a replica's acknowledgements, this test's INFO,
# the expiry sweepers' look at their registry (cache/documents/expiry.py).
_BACKGROUND = (
    "cmdstat_ping",
    "cmdstat_smembers",
    "cmdstat_info",
    "cmdstat_publish",
    "cmdstat_role",
    "cmdstat_replconf",
    "cmdstat_client|",
    "cmdstat_cluster|",
)
BODY = b'{"name":"ada","langs":["en","fr"]}'


def command_calls(redis_server) -> Counter:
    """Calls of each command since start, summed over every data node."""
    nodes = redis_server.live_nodes() if hasattr(redis_server, "live_nodes") else [redis_server]
    totals: Counter = Counter()
    for node in nodes:
        with node.client() as client:
            for name, stat in client.info("commandstats").items():
                if not name.startswith(_BACKGROUND):
                    totals[name] += stat["calls"]
    return totals


def spent_by(redis_server, action: Callable[[], object], attempts: int = 3) -> Counter:
    """The commands ``action`` sent Redis, done again (up to ``attempts`` times) while it sent any.

    A worker whose invalidations were last confirmed longer than
    JETWAY_HOT_CACHE_MAX_LAG_MS ago (it was paused: PyPy compiling, a loaded
    machine) rightly reads Redis instead of its cache
    (tests/cache/test_invalidation_lag.py); a cache that never serves fails
    every attempt.
    """
    for _ in range(attempts):
        before = command_calls(redis_server)
        action()
        spent = command_calls(redis_server) - before
        if not spent:
            break
    return spent


def fresh_get(api, path: str, **headers: str) -> requests.Response:
    return requests.get(api.server.url(path), headers={**api.auth_header, **headers}, timeout=10)


def warm(api, path: str) -> requests.Response:
    for _ in range(WARM_READS):
        response = fresh_get(api, path)
    return response


def etags(api, path: str, reads: int = 20) -> List[str]:
    """The ETag of each of ``reads`` reads (the status where there is none)."""
    answers = [fresh_get(api, path) for _ in range(reads)]
    return [answer.headers.get("ETag", str(answer.status_code)) for answer in answers]


def statuses(api, path: str, reads: int = 20) -> List[int]:
    return [fresh_get(api, path).status_code for _ in range(reads)]


def test_a_cached_read_with_an_unrated_token_sends_redis_nothing(api, redis_server):
    assert api.put_json("/v1/people/ada", BODY).status_code == 201
    warm(api, "/v1/people/ada")

    def read() -> None:
        answers = [fresh_get(api, "/v1/people/ada") for _ in range(50)]
        assert [(answer.status_code, answer.content) for answer in answers] == [(200, BODY)] * 50

    assert spent_by(redis_server, read) == Counter()


def test_if_none_match_is_answered_304_from_the_cache(api, redis_server):
    etag = api.put_json("/v1/people/ada", BODY).headers["ETag"]
    warm(api, "/v1/people/ada")

    def read() -> None:
        answers = [fresh_get(api, "/v1/people/ada", **{"If-None-Match": etag}) for _ in range(20)]
        assert [(answer.status_code, answer.headers["ETag"]) for answer in answers] == [(304, etag)] * 20

    assert spent_by(redis_server, read) == Counter()


# Over JETWAY_COMPRESS_MIN_BYTES (1 KB by default): stored with a gzip variant.
LARGE = b'{"text":"' + b"jetway stores JSON as bytes " * 60 + b'"}'
# What a read answers, but the Date and the request's own id.
_ANSWER_HEADERS = (
    "ETag",
    "Last-Modified",
    "Content-Encoding",
    "Content-Length",
    "Content-Type",
    "Vary",
    "Cache-Control",
)


def wire_answer(api, path: str, **headers: str):
    """Status, the body as sent (not decoded) and the headers of a read on a fresh connection."""
    with requests.get(api.server.url(path), headers={**api.auth_header, **headers}, timeout=10, stream=True) as got:
        body = got.raw.read(decode_content=False)
        return got.status_code, body, {name: got.headers.get(name) for name in _ANSWER_HEADERS}


def test_cached_reads_answer_byte_for_byte_as_uncached_ones_gzip_and_validators_included(api, redis_server):
    written = api.put_json("/v1/people/ada", LARGE)
    assert written.status_code == 201
    gzip_tag = fresh_get(api, "/v1/people/ada", **{"Accept-Encoding": "gzip"}).headers["ETag"]
    assert gzip_tag != written.headers["ETag"]  # the variant's own tag
    requests_ = {
        "gzip": {"Accept-Encoding": "gzip"},
        "identity": {"Accept-Encoding": "identity"},
        "by date": {"Accept-Encoding": "gzip", "If-Modified-Since": written.headers["Last-Modified"]},
        "by the gzip tag": {"Accept-Encoding": "identity", "If-None-Match": gzip_tag},
        "by the identity tag": {"Accept-Encoding": "gzip", "If-None-Match": written.headers["ETag"]},
    }
    uncached = {
        what: wire_answer(api, "/v1/people/ada", **h, **{"Cache-Control": "no-cache"}) for what, h in requests_.items()
    }
    warm(api, "/v1/people/ada")

    def read() -> None:
        for _ in range(4):  # both workers, on fresh connections
            cached = {what: wire_answer(api, "/v1/people/ada", **headers) for what, headers in requests_.items()}
            assert cached == uncached

    assert spent_by(redis_server, read) == Counter()
    assert [uncached[what][0] for what in requests_] == [200, 200, 304, 304, 304]
    assert uncached["gzip"][2]["Content-Encoding"] == "gzip" and gzip.decompress(uncached["gzip"][1]) == LARGE


def test_a_rated_token_still_spends_its_rate_in_redis_on_a_cached_read(api, redis_server):
    token = api.server.make_token("rated", "read:*", rate="100000/s")
    assert api.put_json("/v1/people/ada", BODY).status_code == 201
    rated = {"Authorization": f"Bearer {token}"}
    for _ in range(WARM_READS):
        requests.get(api.server.url("/v1/people/ada"), headers=rated, timeout=10)
    before = command_calls(redis_server)
    answers = [requests.get(api.server.url("/v1/people/ada"), headers=rated, timeout=10) for _ in range(30)]
    assert all(answer.status_code == 200 and answer.headers["RateLimit-Limit"] for answer in answers)
    spent = command_calls(redis_server) - before
    assert spent["cmdstat_evalsha"] == 30  # one rate step each
    assert spent["cmdstat_hmget"] == 0  # and no read of the document


def test_cache_control_no_cache_reads_from_redis(api, redis_server):
    assert api.put_json("/v1/people/ada", BODY).status_code == 201
    warm(api, "/v1/people/ada")
    before = command_calls(redis_server)
    for value in ["no-cache"] * 10 + ["max-age=0"] * 5 + ["No-Cache, no-store"] * 5:
        assert fresh_get(api, "/v1/people/ada", **{"Cache-Control": value}).content == BODY
    assert (command_calls(redis_server) - before)["cmdstat_hmget"] == 20


def test_every_write_through_any_worker_is_read_back_by_every_worker_at_once(api):
    warm(api, "/v1/people/ada")
    for round_ in range(10):
        written = api.put_json("/v1/people/ada", b'{"round":%d}' % round_)
        assert written.status_code in (200, 201)
        assert etags(api, "/v1/people/ada", 10) == [written.headers["ETag"]] * 10
    patched = api.patch_merge("/v1/people/ada", b'{"patched":true}')
    assert etags(api, "/v1/people/ada", 10) == [patched.headers["ETag"]] * 10
    assert api.delete("/v1/people/ada").status_code == 204
    assert statuses(api, "/v1/people/ada", 10) == [404] * 10


def test_a_worker_reads_its_own_writes_on_one_connection(api):
    for round_ in range(50):
        written = api.put_json("/v1/people/ada", b'{"round":%d}' % round_)
        read = api.get("/v1/people/ada")
        assert (read.headers["ETag"], read.content) == (written.headers["ETag"], b'{"round":%d}' % round_)


def test_a_write_through_another_instance_is_seen_at_once(api, redis_server, tmp_path):
    other = JetwayServer(redis_server.url, tmp_path / "other.log", auth=True)
    try:
        other.start()
        assert api.put_json("/v1/people/ada", BODY).status_code == 201
        warm(api, "/v1/people/ada")
        for round_ in range(5):
            written = requests.put(
                other.url("/v1/people/ada"),
                data=b'{"round":%d}' % round_,
                headers={**api.auth_header, "Content-Type": "application/json"},
                timeout=10,
            )
            assert written.status_code == 200
            assert etags(api, "/v1/people/ada", 10) == [written.headers["ETag"]] * 10
    finally:
        other.stop()


def test_a_change_made_in_redis_itself_is_seen_at_once(api, redis_client):
    assert api.put_json("/v1/people/ada", BODY).status_code == 201
    warm(api, "/v1/people/ada")
    key = next(key for key in redis_client.scan_iter(b"jw:{people:*}:d:ada"))
    redis_client.hset(key, mapping={b"b": b'{"by":"redis-cli"}', b"e": b'"cli-1"'})
    assert etags(api, "/v1/people/ada") == ['"cli-1"'] * 20
    assert fresh_get(api, "/v1/people/ada").content == b'{"by":"redis-cli"}'
    warm(api, "/v1/people/ada")
    redis_client.delete(key)
    assert statuses(api, "/v1/people/ada") == [404] * 20


def test_a_flush_empties_every_workers_cache(api, redis_client, suite_token):
    for doc_id in ("a", "b", "c"):
        api.put_json(f"/v1/people/{doc_id}", BODY)
        warm(api, f"/v1/people/{doc_id}")
    redis_client.flushall()
    for key, value in suite_token[1].items():  # the token again, not the documents
        redis_client.restore(key, 0, value, replace=True)
    for doc_id in ("a", "b", "c"):
        assert statuses(api, f"/v1/people/{doc_id}", 10) == [404] * 10


def test_a_cached_document_is_not_served_past_its_expiry(api, redis_client):
    """Not even before Redis deletes it (and says so): the entry keeps the expiry read with it."""
    assert api.put_json("/v1/people/brief?ttl=2", BODY).status_code == 201
    assert api.put_json("/v1/people/ada", BODY).status_code == 201
    warm(api, "/v1/people/brief")
    ada = next(key for key in redis_client.scan_iter(b"jw:{people:*}:d:ada"))
    redis_client.pexpire(ada, 1500)  # an expiry set outside Jetway
    warm(api, "/v1/people/ada")
    brief = next(key for key in redis_client.scan_iter(b"jw:{people:*}:d:brief"))
    for key, path in ((ada, "/v1/people/ada"), (brief, "/v1/people/brief")):
        # PTTL answers -2 once the expiry has passed, whether or not Redis has deleted the key yet.
        wait_until(lambda key=key: redis_client.pttl(key) == -2, 10, f"{path} to expire")
        assert statuses(api, path) == [404] * 20


def test_a_killed_invalidation_connection_comes_back_and_misses_nothing(api, redis_server, redis_client):
    assert api.put_json("/v1/people/ada", BODY).status_code == 201
    warm(api, "/v1/people/ada")
    nodes = redis_server.live_nodes() if hasattr(redis_server, "live_nodes") else [redis_server]
    killed = 0
    for node in nodes:
        with node.client() as client:
            for connection in client.client_list():
                if connection.get("name") == "jetway-hot-cache":
                    killed += client.client_kill_filter(_id=connection["id"])
    assert killed >= 2  # both workers' (a cluster: one per master each)
    key = next(key for key in redis_client.scan_iter(b"jw:{people:*}:d:ada"))
    redis_client.hset(key, b"e", b'"after-kill"')
    assert etags(api, "/v1/people/ada") == ['"after-kill"'] * 20
    wait_until(lambda: hot_figures(api)["bypassed"] == 0, 10, "every worker's cache to be live again")
    redis_client.hset(key, b"e", b'"after-return"')
    warm(api, "/v1/people/ada")
    assert etags(api, "/v1/people/ada") == ['"after-return"'] * 20


def test_the_metrics_count_per_worker_and_for_the_instance(api):
    api.put_json("/v1/people/ada", BODY)
    warm(api, "/v1/people/ada")
    # Other workers write their figures once a second: a scrape may be that far behind.
    wait_until(lambda: hot_figures(api)["entries"] >= 2, 10, "both workers' entries in /metrics")
    figures = hot_figures(api)
    assert figures["hits"] >= WARM_READS - 4 and figures["misses"] >= 2
    assert figures["bytes"] > 2 * len(BODY) and figures["bypassed"] == 0
    assert figures["workers"] == 2


def hot_figures(api) -> Dict[str, float]:
    """The instance's hot cache figures from /metrics, and how many workers report their own."""
    text = requests.get(api.server.url("/metrics"), timeout=10).text
    figures: Dict[str, float] = {}
    pids = set()
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("jetway_hot_cache_worker{"):
            pids.add(name.split('pid="')[1].split('"')[0])
        elif name.startswith("jetway_hot_cache_"):
            figures[name[len("jetway_hot_cache_") :].removesuffix("_total")] = float(value)
    figures["workers"] = len(pids)
    return figures


@pytest.fixture
def small_redis(own_redis, tmp_path):
    """A Redis that evicts at 4 MB, with a Jetway of its own (authorization off)."""
    with own_redis.client() as client:
        client.config_set("maxmemory-policy", "allkeys-random")
    server = JetwayServer(own_redis.url, tmp_path / "jetway.log")
    try:
        yield own_redis, server.start()
    finally:
        server.stop()


def test_a_document_redis_evicts_under_maxmemory_is_not_served(small_redis):
    redis_server, server = small_redis
    paths = [f"/v1/cached/d{n}" for n in range(20)]
    for path in paths:
        assert requests.put(server.url(path), data=BODY, headers={"Content-Type": "application/json"}, timeout=10).ok
        for _ in range(WARM_READS // 2):
            assert requests.get(server.url(path), timeout=10).status_code == 200
    with redis_server.client() as client:
        client.config_set("maxmemory", str(client.info("memory")["used_memory"] + 2_000_000))
        filler = b"x" * 10_000
        for n in range(2_000):
            client.set(f"filler:{n}", filler)
        evicted = [path for path in paths if not client.exists(_document_key(path))]
        assert client.info("stats")["evicted_keys"] > 0
    assert evicted, "no cached document was evicted: the filler was too small"
    for path in evicted:
        assert [requests.get(server.url(path), timeout=10).status_code for _ in range(10)] == [404] * 10


def _document_key(path: str) -> bytes:
    collection, doc_id = path.split("/")[2:]
    return document_key(collection.encode(), doc_id.encode())
