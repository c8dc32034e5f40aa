"""cache.documents.expiry: the registry heals itself, one sweeper holds a collection's lease, another takes it over.

Two sweepers on a private redis-server (a served worker of the suite's would
take the lease too), driven tick by tick in a script, as the workers' loops
drive them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any, Dict

from tests.support import ROOT, RedisServer, stop_process

SCRIPT = """
import json, sys
from twisted.internet import defer, task
from cache import keys
from cache.documents.expiry import ExpiringCollections, ExpirySweeper, SWEEP_NAME
from cache.documents.store import DocumentStore
from cache.documents.write_plan import WritePlan
from cache.feed.streams import FeedLog
from cache.redis.address import parse_redis_url
from cache.redis.link import RedisLink

async def run(reactor, path):
    link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
    store = DocumentStore(link, feed=FeedLog())
    first = ExpirySweeper(link, store.writes.expiring, FeedLog(), reactor)
    second = ExpirySweeper(link, ExpiringCollections(link), FeedLog(), reactor)
    figures = {}
    await store.put(b"c", b"a", b'{"v":1}', plan=WritePlan(b"1"))
    await task.deferLater(reactor, 0.05, lambda: None)
    figures["registered"] = sorted(x.decode() for x in await link.execute(b"SMEMBERS", keys.EXPIRING))
    await link.execute(b"DEL", keys.EXPIRING)  # lost: a flush, a failover that lost the write
    await first.tick()
    figures["healed"] = sorted(x.decode() for x in await link.execute(b"SMEMBERS", keys.EXPIRING))
    lease = keys.index_build_lease_key(b"c", SWEEP_NAME, b"")
    figures["holder"] = (await link.execute(b"GET", lease)).decode().startswith("%d:" % __import__("os").getpid())
    await store.put(b"c", b"b", b'{"v":1}', plan=WritePlan(b"1"))
    await task.deferLater(reactor, 1.2, lambda: None)  # both due (a TTL of 1 s)
    await second.tick()
    figures["second_before"] = second.expired
    await first.tick()
    figures["first"] = first.expired
    # The first dies: its lease runs out (made to at once here), and the second's next tick takes the sweep over.
    await store.put(b"c", b"d", b'{"v":1}', plan=WritePlan(b"1"))
    await link.execute(b"PEXPIRE", lease, 1)
    await task.deferLater(reactor, 1.2, lambda: None)
    await second.tick()
    figures["second_after"] = second.expired
    ops = []
    for shard in range(keys.INDEX_SHARDS):
        for _, fields in await link.execute(b"XRANGE", keys.feed_key(b"c", shard), b"-", b"+"):
            ops.append(fields[1].decode() + " " + fields[3].decode())
    figures["ops"] = sorted(ops)
    # Nothing left to expire and the registry lost again: forgotten at the second look, not registered again.
    await link.execute(b"DEL", keys.EXPIRING)
    await first.tick()
    await first.tick()
    figures["forgotten"] = await link.execute(b"SMEMBERS", keys.EXPIRING)
    await store.put(b"c", b"e", b'{"v":1}', plan=WritePlan(b"60"))
    await task.deferLater(reactor, 0.05, lambda: None)
    figures["noted_again"] = sorted(x.decode() for x in await link.execute(b"SMEMBERS", keys.EXPIRING))
    print(json.dumps(figures), flush=True)

def main(reactor, path):
    return defer.ensureDeferred(run(reactor, path))

task.react(main, [sys.argv[1]])
"""


def run_script(own_redis: Any) -> Dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), own_redis.socket_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_registry_heals_one_sweeper_holds_the_lease_and_another_takes_it_over(own_redis) -> None:
    figures = run_script(own_redis)
    assert figures["registered"] == ["c"]  # a write with a TTL registers its collection
    assert figures["healed"] == ["c"]  # registered again by a tick of a worker that wrote it
    assert figures["holder"] is True
    assert figures["second_before"] == 0  # not its lease: it leaves the due expiries to the holder
    assert figures["first"] == 2
    assert figures["second_after"] == 1  # the holder gone, the lease lapsed: the next tick of another sweeps
    assert figures["ops"] == ["expire a", "expire b", "expire d", "put a", "put b", "put d"]
    assert figures["forgotten"] == []  # no expiring document: not put back by a look
    assert figures["noted_again"] == ["c"]  # the next write with a TTL registers it again


OUTAGE_SCRIPT = """
import json, os, sys
from twisted.internet import defer, task
from twisted.logger import globalLogPublisher
from cache.documents.expiry import ExpiringCollections, ExpirySweeper
from cache.feed.streams import FeedLog
from cache.redis.address import parse_redis_url
from cache.redis.link import RedisLink

said = []
globalLogPublisher.addObserver(
    lambda event: said.append((event["log_level"].name, event.get("log_format", "")))
    if str(event.get("log_format", "")).startswith("expiry sweep") else None
)

async def run(reactor, path):
    link = RedisLink(parse_redis_url("unix://" + path), reactor, 1.0)
    sweeper = ExpirySweeper(link, ExpiringCollections(link), FeedLog(), reactor)
    for _ in range(5):  # no Redis yet: every tick fails alike
        await sweeper.tick()
    print("down", flush=True)
    while not os.path.exists(path):
        await task.deferLater(reactor, 0.05, lambda: None)
    for _ in range(100):  # until a tick goes through (Redis answers once it has loaded)
        await sweeper.tick()
        if any(level == "info" for level, _ in said):
            break
        await task.deferLater(reactor, 0.1, lambda: None)
    await sweeper.tick()
    print(json.dumps(said), flush=True)

def main(reactor, path):
    return defer.ensureDeferred(run(reactor, path))

task.react(main, [sys.argv[1]])
"""


def test_an_outage_is_one_warning_and_its_end_one_line(tmp_path) -> None:
    """The sweeper ticks four times a second: while Redis is away it says so once, not at every tick."""
    redis = RedisServer(tmp_path / "redis")
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(OUTAGE_SCRIPT), redis.socket_path],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as script:  # its pipes closed at the end
        try:
            assert script.stdout is not None
            assert script.stdout.readline().strip() == "down"
            redis.start()
            said = json.loads(script.stdout.readline())
            assert script.wait(60) == 0, script.stderr.read() if script.stderr else ""
        finally:
            stop_process(script)
            redis.stop()
    levels = [level for level, _ in said]
    assert levels == ["warn", "info"], said
    assert "trying again" in said[0][1] and "going on" in said[1][1]
