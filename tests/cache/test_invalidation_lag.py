"""cache.hot.tracking's heartbeat: the hot cache is bypassed while its invalidations lag more than its bound.

Scripts in the app's interpreter (``tests.cache.test_tracking.run_script``)
against a Redis of their own: the store reads Redis directly, and the
tracker's connection goes through a relay that delays what Redis sends
(tests/delay_relay.py), as a far or lossy network would delay invalidations.
Another client's write is acknowledged at once; its invalidation arrives
the relay's delay later.
"""

from __future__ import annotations

import textwrap

from tests.cache.test_tracking import run_script

LAGGING = """
from tests.delay_relay import DelayRelay
import time

MAX_LAG = 0.03

async def setup(reactor, path):
    relay = await DelayRelay(reactor, path).listen()
    link = RedisLink(parse_redis_url("unix://" + path), reactor, 5.0)
    hot = HotCache(1 << 20, max_lag=MAX_LAG)
    feed = InvalidationFeed(hot)
    feed.add("relayed", Tracker("relayed", TCP4ClientEndpoint(reactor, "127.0.0.1", relay.port), feed, reactor, 2.0))
    store = DocumentStore(link, hot=hot)
    await until(reactor, lambda: hot.fresh, "the feed, confirmed")
    await store.put(b"things", b"a", b'{"v":0}')
    await held(reactor, store, hot)
    return relay, link, hot, feed, store

async def held(reactor, store, hot):
    '''Read the document until the cache holds it. On a loaded machine a pause past MAX_LAG makes a read
    bypass the cache (it is the bound at work): each read waits for a fresh pong first.'''
    for _ in range(100):
        await until(reactor, lambda: hot.fresh, "a fresh pong")
        await store.get(b"things", b"a")
        if KEY in hot._entries:
            return
    raise AssertionError("not cached")

async def fresh_hits(reactor, store, hot, wanted):
    '''Reads, each once the cache is fresh, until ``wanted`` of them were hits (or 20 times as many reads).'''
    hits = hot.hits
    for _ in range(20 * wanted):
        if hot.hits - hits >= wanted:
            break
        await until(reactor, lambda: hot.fresh, "a fresh pong")
        await store.get(b"things", b"a")
    return hot.hits - hits

async def stale_reads(reactor, path, store, rounds):
    '''Another client writes version n (acknowledged), and 2 * MAX_LAG later this worker reads:
    the reads that returned an older version than the last acknowledged one.'''
    stale = []
    for n in range(1, rounds + 1):
        redis(path, b"HSET", KEY, b"e", b'"v%d"' % n)
        await task.deferLater(reactor, 2 * MAX_LAG, lambda: None)
        etag = (await store.get(b"things", b"a")).etag.decode()
        if etag != '"v%d"' % n:
            stale.append((n, etag))
    return stale
"""


def test_a_read_after_another_clients_acknowledged_write_is_fresh_while_invalidations_lag(own_redis):
    """Invalidations delayed 100 ms, bound 30 ms: a read 60 ms after another client's acknowledged write
    returns that write (from Redis), never the cached older version (which the old code served)."""
    figures = run_script(
        own_redis,
        LAGGING
        + textwrap.dedent(
            """
        async def run(reactor, path):
            relay, link, hot, feed, store = await setup(reactor, path)
            hits = hot.hits
            relay.delay = 0.1
            stale = await stale_reads(reactor, path, store, 10)
            out(stale=stale, hits_while_lagging=hot.hits - hits, lagging=hot.lagging, live=hot.live,
                fresh=hot.fresh, lag=round(feed.trackers["relayed"].lag, 3))
            feed.stop()
            await link.close()
        """
        ),
    )
    assert figures["stale"] == []
    assert figures["hits_while_lagging"] == 0
    assert figures["lagging"] > 0  # held entries were there, and refused
    assert figures["live"] is True and figures["fresh"] is False  # subscribed all along, but late
    assert figures["lag"] >= 0.1


def test_the_cache_serves_again_once_the_lag_is_back_under_its_bound(own_redis):
    figures = run_script(
        own_redis,
        LAGGING
        + textwrap.dedent(
            """
        async def run(reactor, path):
            relay, link, hot, feed, store = await setup(reactor, path)
            relay.delay = 0.1
            await task.deferLater(reactor, 0.2, lambda: None)
            fresh_lagging = hot.fresh
            stale_lagging = await stale_reads(reactor, path, store, 3)
            relay.delay = 0.0
            await until(reactor, lambda: hot.fresh, "the lag to come back under the bound")
            await task.deferLater(reactor, 0.15, lambda: None)  # the invalidations held in the relay
            await held(reactor, store, hot)
            hits_after = await fresh_hits(reactor, store, hot, 10)
            stale_after = await stale_reads(reactor, path, store, 3)
            await until(reactor, lambda: hot.fresh, "fresh again")  # a loaded machine's pause may outlast the bound
            out(fresh_lagging=fresh_lagging, stale_lagging=stale_lagging, hits_after=hits_after,
                stale_after=stale_after, fresh=hot.fresh)
            feed.stop()
            await link.close()
        """
        ),
    )
    assert figures["fresh_lagging"] is False
    assert figures["stale_lagging"] == [] and figures["stale_after"] == []
    assert figures["hits_after"] >= 10
    assert figures["fresh"] is True


def test_a_tracking_connection_lost_empties_and_bypasses_the_cache_until_confirmed_again(own_redis):
    figures = run_script(
        own_redis,
        LAGGING
        + textwrap.dedent(
            """
        async def run(reactor, path):
            relay, link, hot, feed, store = await setup(reactor, path)
            tracker = feed.trackers["relayed"]
            tracker.live.transport.abortConnection()
            await until(reactor, lambda: not hot.live, "the feed to go down")
            emptied, fresh_when_down = len(hot), hot.fresh
            await until(reactor, lambda: hot.fresh, "the feed to come back, confirmed")
            out(emptied=emptied, fresh_when_down=fresh_when_down)
            feed.stop()
            await link.close()
        """
        ),
    )
    assert figures == {"emptied": 0, "fresh_when_down": False}


def test_an_idle_cache_pings_once_a_second_and_its_first_read_wakes_the_heartbeat(own_redis):
    """Nobody reads: the tracker pings every PING_INTERVAL, not every bound/4 (an idle worker's CPU).
    The first read of a held entry after the idle spell goes to Redis and wakes the heartbeat; once its
    pong is back, reads hit again, and the bound's pace holds while they go on."""
    figures = run_script(
        own_redis,
        LAGGING
        + textwrap.dedent(
            """
        import cache.hot.tracking as tracking

        async def pongs_over(reactor, tracker, seconds):
            heard = []
            tracker.heard, original = (lambda sent_at: (heard.append(sent_at), original(sent_at))), tracker.heard
            await task.deferLater(reactor, seconds, lambda: None)
            tracker.heard = original
            return len(heard)

        async def run(reactor, path):
            tracking.IDLE_AFTER = 0.3
            relay, link, hot, feed, store = await setup(reactor, path)
            tracker = feed.trackers["relayed"]
            busy = 0
            for _ in range(10):  # reads every 20 ms: the bound's pace (30 ms / 4)
                busy += await pongs_over(reactor, tracker, 0.02)
                etag = (await store.get(b"things", b"a")).etag.decode()
            await task.deferLater(reactor, 0.5, lambda: None)  # idle past IDLE_AFTER
            idle = await pongs_over(reactor, tracker, 1.5)
            fresh_when_idle = hot.fresh
            hits, lagging = hot.hits, hot.lagging
            first = (await store.get(b"things", b"a")).etag.decode()
            first_lagged = hot.lagging - lagging
            await until(reactor, lambda: hot.fresh, "the pong of the woken heartbeat", timeout=0.5)
            await store.get(b"things", b"a")
            out(busy=busy, idle=idle, fresh_when_idle=fresh_when_idle, same=first == etag, first_lagged=first_lagged,
                hits_after_wake=hot.hits - hits)
            feed.stop()
            await link.close()
        """
        ),
    )
    assert figures["busy"] >= 10  # 0.2 s of reads at 7.5 ms a PING: some 26 pongs; a loaded machine skips some
    assert figures["idle"] <= 2  # 1.5 s idle at one PING a second
    assert figures["fresh_when_idle"] is False  # the last confirmation is older than the bound
    assert figures["same"] is True and figures["first_lagged"] == 1  # the held entry refused: read from Redis
    assert figures["hits_after_wake"] == 1
