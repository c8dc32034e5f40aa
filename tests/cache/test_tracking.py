"""cache.hot.tracking with cache.hot.cache and the store, on a real redis-server, in a reactor.

Each test runs a script in the app's interpreter against a Redis of its own
(``own_redis``) and checks the figures it printed. The order of events across
the data connection and the invalidation connection is made certain by a
relay in the script's reactor that holds Redis's replies back
(tests/twisted_relay.py), and by waiting for the cache's own counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any, Dict

from tests.support import ROOT

PRELUDE = """
import json, socket, sys
from twisted.internet import defer, task
from cache.redis.address import parse_redis_url
from cache.hot.cache import HotCache
from cache.keys import document_key
from cache.redis.link import RedisLink
from cache.documents.store import DocumentStore
from cache.hot.tracking import invalidation_feed
from cache.hot.tracking import InvalidationFeed, Tracker
from twisted.internet.endpoints import TCP4ClientEndpoint
from tests.twisted_relay import HoldingRelay

def out(**figures):
    print(json.dumps(figures), flush=True)

def redis(path, *command):
    '''One command on a connection of its own, as redis-cli would send it: another client's write.'''
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(path)
        raw.sendall(b"*%d\\r\\n" % len(command) + b"".join(b"$%d\\r\\n%s\\r\\n" % (len(a), a) for a in command))
        return raw.recv(4096)

async def until(reactor, condition, what, timeout=10.0):
    waited = 0.0
    while not condition():
        if waited > timeout:
            raise AssertionError("waited %.1f s for %s" % (timeout, what))
        await task.deferLater(reactor, 0.01, lambda: None)
        waited += 0.01

async def cached(reactor, store, hot, key):
    '''Read the document until the hot cache holds it (a key is let in on its second miss).'''
    for _ in range(3):
        await store.get(b"things", b"a")
    assert hot.get(key) is not None, "not cached"

KEY = document_key(b"things", b"a")

def relayed_tracker(reactor, relay, feed, timeout):
    return Tracker("relayed", TCP4ClientEndpoint(reactor, "127.0.0.1", relay.port), feed, reactor, timeout)

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


def test_a_reply_that_comes_after_an_invalidation_of_its_key_does_not_fill(own_redis):
    """The fill race, in a certain order: Redis runs the read, then another client's write;
    the write's invalidation reaches the worker; only then the read's reply (old bytes)."""
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            relay = await HoldingRelay(reactor, path).listen()
            link = RedisLink(parse_redis_url(relay.url), reactor, 5.0)
            hot = HotCache(1 << 20)
            feed = invalidation_feed(parse_redis_url("unix://" + path), link, hot, reactor, 5.0)
            store = DocumentStore(link, hot=hot)
            await until(reactor, lambda: hot.live, "the feed")
            await store.put(b"things", b"a", b'{"v":1}')
            await cached(reactor, store, hot, KEY)
            seen = hot.invalidations
            redis(path, b"HSET", KEY, b"e", b'"outside-2"')
            await until(reactor, lambda: hot.invalidations > seen, "the first write's invalidation")
            dropped = hot.get(KEY) is None

            relay.hold()
            reading = store.get(b"things", b"a")  # a second miss, let in: it may fill
            await until(reactor, lambda: relay.held_bytes > 0, "Redis's reply to the read, held")
            seen = hot.invalidations
            redis(path, b"HSET", KEY, b"e", b'"outside-3"')  # after the read, in Redis's order
            await until(reactor, lambda: hot.invalidations > seen, "the second write's invalidation")
            relay.release()
            raced = await reading
            after_race = hot.get(KEY)
            refused = hot.refused_fills

            await store.get(b"things", b"a")  # no race now: this one fills
            filled = hot.get(KEY)
            out(raced=raced.etag.decode(), cached_after_race=after_race is not None, refused=refused,
                filled=filled.etag.decode() if filled else None, dropped=dropped)
            feed.stop()
            await link.close()
        """,
    )
    assert figures["dropped"] is True  # an outside write drops the entry
    assert figures["raced"] == '"outside-2"'  # the reply held back carried the bytes from before the write
    assert figures["cached_after_race"] is False
    assert figures["refused"] == 1
    assert figures["filled"] == '"outside-3"'  # and the cache does fill when nothing races


def test_while_the_invalidation_connection_is_down_nothing_is_cached_or_served_from_the_cache(own_redis):
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            relay = await HoldingRelay(reactor, path).listen()
            link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
            hot = HotCache(1 << 20)
            feed = InvalidationFeed(hot)
            feed.add("relayed", relayed_tracker(reactor, relay, feed, 5.0))
            store = DocumentStore(link, hot=hot)
            await until(reactor, lambda: hot.live, "the feed")
            await store.put(b"things", b"a", b'{"v":1}')
            await cached(reactor, store, hot, KEY)

            relay.refusing = True
            relay.cut()  # the invalidation connection is lost, and cannot come back for now
            await until(reactor, lambda: not hot.live, "the feed to go down")
            entries_when_down = len(hot)
            redis(path, b"HSET", KEY, b"e", b'"outside"')  # an invalidation nobody hears
            reads = [(await store.get(b"things", b"a")).etag.decode() for _ in range(5)]
            entries_while_down = len(hot)
            hmgets = int(redis(path, b"INFO", b"commandstats").split(b"cmdstat_hmget:calls=")[1].split(b",")[0])

            relay.refusing = False
            await until(reactor, lambda: hot.live, "the feed to come back")
            for _ in range(3):
                await store.get(b"things", b"a")
            out(entries_when_down=entries_when_down, reads=reads, entries_while_down=entries_while_down,
                hmgets=hmgets, cached_again=hot.get(KEY) is not None)
            feed.stop()
            await link.close()
        """,
    )
    assert figures["entries_when_down"] == 0
    assert figures["reads"] == ['"outside"'] * 5
    assert figures["entries_while_down"] == 0
    assert figures["cached_again"] is True


def test_an_unanswered_ping_takes_the_cache_down_and_a_flush_empties_it(own_redis):
    figures = run_script(
        own_redis,
        """
        async def run(reactor, path):
            relay = await HoldingRelay(reactor, path).listen()
            link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
            hot = HotCache(1 << 20)
            feed = InvalidationFeed(hot)
            # A timeout of 0.5 s: the tracker gives up on a PING after it, checking once a second.
            feed.add("relayed", relayed_tracker(reactor, relay, feed, 0.5))
            store = DocumentStore(link, hot=hot)
            await until(reactor, lambda: hot.live, "the feed")
            for doc_id in (b"a", b"b"):
                seen = hot.invalidations
                await store.put(b"things", doc_id, b'{"v":1}')
                # The write's own invalidation comes back through the relay some 40 ms later:
                # heard after the reads below, it would rightly drop what they cached.
                await until(reactor, lambda: hot.invalidations > seen, "the write's invalidation")
                for _ in range(2):
                    await store.get(b"things", doc_id)
            before_flush = len(hot)
            redis(path, b"FLUSHALL")
            await until(reactor, lambda: len(hot) == 0, "the flush's invalidation")
            live_after_flush = hot.live

            relay.hold()  # the connection stays up but Redis's answers stop coming: a silent network
            await until(reactor, lambda: not hot.live, "the PING to time out")
            relay.release()
            await until(reactor, lambda: hot.live, "the feed to come back")
            out(before_flush=before_flush, live_after_flush=live_after_flush)
            feed.stop()
            await link.close()
        """,
    )
    assert figures == {"before_flush": 2, "live_after_flush": True}
