"""/v1/_batch with the hot cache: a batch's writes drop the worker's own entries, its gets read cached documents.

The rules are held on a real redis-server in a script with a hot cache
that has no invalidation feed (``up()`` by hand): an entry then goes only
when the store drops it itself, so a missing hook leaves a stale entry
that the test sees, whatever the timing. Through HTTP, the session's
Jetway (both workers, cache on) reads a batch's writes back at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any, Dict

import requests

from tests.cache.test_hot_cache_api import WARM_READS, command_calls, fresh_get, spent_by
from tests.support import ROOT

PRELUDE = """
import json, socket, sys
from twisted.internet import defer, task
from cache.redis.address import parse_redis_url
from cache.batches.batch import BatchRunner, Operation
from cache.hot.cache import HotCache
from cache.keys import document_key
from cache.redis.link import RedisLink
from cache.documents.store import Conditions, DocumentStore
from cache.documents.write_concern import PRIMARY_ONLY

KEY = document_key(b"things", b"a")

def out(**figures):
    print(json.dumps(figures), flush=True)

def behind(path, *command):
    '''One command on a connection of its own: a change the cache hears nothing of (it has no feed).'''
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(path)
        raw.sendall(b"*%d\\r\\n" % len(command) + b"".join(b"$%d\\r\\n%s\\r\\n" % (len(a), a) for a in command))
        return raw.recv(4096)

async def setup(reactor, path):
    link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
    hot = HotCache(1 << 22)
    hot.up()  # no feed: only the store's own hooks drop entries
    store = DocumentStore(link, hot=hot)
    first, _ = await store.put(b"things", b"a", b'{"v":1}')
    for _ in range(3):  # a key is let in on its second miss
        await store.get(b"things", b"a")
    assert hot.get(KEY) is not None, "not cached"
    return store, hot, BatchRunner(store, link, PRIMARY_ONLY), first

def etag_of(result):
    return None if result.document is None else result.document.etag.decode()

def main(reactor, path):
    return defer.ensureDeferred(run(reactor, path))
"""


def run_script(own_redis: Any, body: str) -> Dict[str, Any]:
    code = PRELUDE + textwrap.dedent(body) + "\ntask.react(main, [sys.argv[1]])\n"
    result = subprocess.run(
        [sys.executable, "-c", code, own_redis.socket_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_write_of_a_batch_drops_the_workers_entry_before_the_batch_answers(own_redis):
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            store, hot, batches, first = await setup(reactor, path)
            after = {}
            for op, extra in [("put", dict(body=b'{"v":2}')), ("patch", dict(patch={"p": 1})), ("delete", {})]:
                for _ in range(3):
                    await store.get(b"things", b"a")
                held = hot.get(KEY) is not None
                results = await batches.run([Operation(op, b"things", b"a", **extra)])
                assert results[0].error is None, results[0].error
                cached = hot.get(KEY)
                read = await store.get(b"things", b"a")
                after[op] = [held, cached is None, None if read is None else read.body.decode()]
            out(after=after)
        """,
    )
    assert figures["after"] == {
        "put": [True, True, '{"v":2}'],
        "patch": [True, True, '{"v":2,"p":1}'],
        "delete": [True, True, None],
    }


def test_a_failed_write_of_a_batch_drops_the_entry_too(own_redis):
    """A write whose outcome is a refusal (or unknown) may still have changed what the entry held."""
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            store, hot, batches, first = await setup(reactor, path)
            stale = Operation("put", b"things", b"a", body=b'{"v":2}', conditions=Conditions(b'"other"'))
            results = await batches.run([stale])
            out(error=type(results[0].error).__name__, dropped=hot.get(KEY) is None)
        """,
    )
    assert figures == {"error": "PreconditionFailed", "dropped": True}


def test_a_batch_get_is_answered_from_the_cache_unless_fresh_or_written_before_it_in_the_batch(own_redis):
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            store, hot, batches, first = await setup(reactor, path)
            behind(path, b"HSET", KEY, b"b", b'{"v":"behind"}', b"e", b'"behind"')
            cached = await batches.run([Operation("get", b"things", b"a")])
            fresh = await batches.run([Operation("get", b"things", b"a")], fresh=True)
            still = hot.get(KEY) is not None
            after_write = await batches.run([
                Operation("get", b"things", b"a"),
                Operation("put", b"things", b"a", body=b'{"v":3}'),
                Operation("get", b"things", b"a"),
            ])
            out(cached=etag_of(cached[0]), first=first.etag.decode(), fresh=etag_of(fresh[0]), still=still,
                before_put=etag_of(after_write[0]), put=etag_of(after_write[1]), after_put=etag_of(after_write[2]))
        """,
    )
    assert figures["cached"] == figures["first"]  # the entry, not Redis: nothing told the cache
    assert figures["fresh"] == '"behind"' and figures["still"]
    assert figures["before_put"] == figures["first"]
    assert figures["after_put"] == figures["put"] != figures["first"]


def test_a_patch_found_done_by_an_earlier_attempt_drops_the_entry(own_redis):
    """A retry under an Idempotency-Key finds its planned ETag stored: the entry goes, alone and in a batch."""
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            store, hot, batches, first = await setup(reactor, path)
            behind(path, b"HSET", KEY, b"b", b'{"v":"done"}', b"e", b'"planned-1"')
            document = await store.patch(b"things", b"a", {"x": 1}, b"", 1 << 20, planned_etag=b'"planned-1"')
            alone = [document.etag.decode(), hot.get(KEY) is None]
            for _ in range(3):
                await store.get(b"things", b"a")
            held = hot.get(KEY) is not None
            behind(path, b"HSET", KEY, b"b", b'{"v":"done2"}', b"e", b'"planned-2"')
            results = await batches.run([Operation("patch", b"things", b"a", patch={"x": 1}, etag=b'"planned-2"')])
            dropped = hot.get(KEY) is None
            read = await store.get(b"things", b"a")
            out(alone=alone, held=held, batch=[etag_of(results[0]), dropped, read.etag.decode()])
        """,
    )
    assert figures == {"alone": ['"planned-1"', True], "held": True, "batch": ['"planned-2"', True, '"planned-2"']}


def test_a_batch_write_is_read_back_at_once_on_the_same_connection(api):
    for _ in range(WARM_READS):
        fresh_get(api, "/v1/people/ada")
    for round_ in range(20):
        operations = [{"op": "put", "collection": "people", "id": "ada", "document": {"round": round_}}]
        written = api.session.post(api.server.url("/v1/_batch"), json={"operations": operations}, timeout=10)
        assert written.status_code == 200, written.text
        result = written.json()["results"][0]
        read = api.get("/v1/people/ada")
        assert (read.headers["ETag"], read.json()) == (result["etag"], {"round": round_})


def test_a_batch_get_of_a_cached_document_sends_redis_no_read(api, redis_server):
    assert api.put_json("/v1/people/ada", b'{"name":"ada"}').status_code == 201
    for _ in range(WARM_READS):
        fresh_get(api, "/v1/people/ada")
    body = {"operations": [{"op": "get", "collection": "people", "id": "ada"}]}

    def read() -> None:
        for _ in range(10):
            answer = requests.post(api.server.url("/v1/_batch"), json=body, headers=api.auth_header, timeout=10)
            assert answer.json()["results"][0]["document"] == {"name": "ada"}

    assert spent_by(redis_server, read)["cmdstat_hmget"] == 0
    before = command_calls(redis_server)
    fresh = {**api.auth_header, "Cache-Control": "no-cache"}
    for _ in range(5):
        requests.post(api.server.url("/v1/_batch"), json=body, headers=fresh, timeout=10)
    assert (command_calls(redis_server) - before)["cmdstat_hmget"] == 5
