"""cache.credentials.token_cache on a real redis-server, in a reactor: no lookup that a revocation overtook is kept.

Like tests/cache/test_tracking.py, each test runs a script in the app's
interpreter against a Redis of its own and checks the figures it printed.
The race is made certain by a relay in the script's reactor that holds
Redis's replies to the token cache's lookups back (tests/twisted_relay.py)
while the revocation's message arrives on the cache's own subscription,
which goes to Redis directly.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, List, Tuple

import pytest
import requests

from cache.credentials.tokens import digest_of, token_key
from tests.cache.test_tracking import run_script
from tests.held_replies import HeldReplies
from tests.support import JetwayServer, keys_cli, make_token, wait_every_worker_serving, wait_until, worker_pids

TOKEN_PRELUDE = """
from cache.credentials.token_cache import TokenCache
from cache.credentials.tokens import CHANGED_CHANNEL, TokenStore, digest_of

def heard(cache):
    '''A list that grows by one digest per invalidation message the cache hears, and a waiter for the next.'''
    messages, waiters = [], []
    forget = cache.forget
    def counting(digest):
        forget(digest)
        messages.append(digest)
        while waiters:
            waiters.pop().callback(None)
    cache.forget = counting
    def next_message():
        waiting = defer.Deferred()
        waiters.append(waiting)
        return waiting
    return messages, next_message

async def held(reactor, relay):
    while not relay.held_bytes:
        await task.deferLater(reactor, 0.0005, lambda: None)
"""


def race_script(trials: int) -> str:
    return (
        TOKEN_PRELUDE
        + """
async def run(reactor, path):
    relay = await HoldingRelay(reactor, path).listen()
    direct = TokenStore(RedisLink(parse_redis_url("unix://" + path), reactor, 5.0))
    relayed_link = RedisLink(parse_redis_url(relay.url), reactor, 5.0)
    cache = TokenCache(TokenStore(relayed_link), parse_redis_url("unix://" + path), reactor, 5.0)
    messages, next_message = heard(cache)
    await until(reactor, lambda: cache.subscribed, "the cache's subscription")
    kept_dead, answered_live, refused_after = 0, 0, 0
    for trial in range(TRIALS):
        token = await direct.create("racer", ["read:*"])
        digest = digest_of(token)
        relay.held_bytes = 0
        relay.hold()
        looking = cache.lookup(digest)  # sent now; its reply (the live record) is held
        await held(reactor, relay)
        message = next_message()
        await direct.revoke("racer")  # deletes the record and publishes its digest
        await message  # the revocation reached the cache before the lookup's reply
        relay.release()
        record = await looking
        answered_live += record is not None
        kept_dead += cache.cached(digest) is not None
        refused_after += (await cache.lookup(digest)) is None
    out(trials=TRIALS, answered_live=answered_live, kept_dead=kept_dead, refused_after=refused_after,
        messages=len(messages))
    await cache.close()
    await relayed_link.close()
"""
    ).replace("TRIALS", str(trials))


@pytest.mark.slow
def test_a_lookup_overtaken_by_its_tokens_revocation_is_not_kept_in_1000_trials(own_redis):
    """The reply of a lookup sent before the revocation arrives after its message: answered, never cached."""
    figures = run_script(own_redis, race_script(1000))
    assert figures["messages"] == 1000
    assert figures["answered_live"] == 1000  # each race was real: the held reply carried the live record
    assert figures["kept_dead"] == 0
    assert figures["refused_after"] == 1000


@pytest.fixture
def relayed_server(own_redis, tmp_path) -> Iterator[Tuple[JetwayServer, HeldReplies]]:
    """2 workers, authorization on, every Redis connection through a relay that can hold a lookup's reply."""
    relay = HeldReplies(own_redis.socket_path).start()
    # A held reply must not time out meanwhile: the CLI's revocation takes a second or two.
    server = JetwayServer(relay.url, tmp_path / "jetway.log", {"JETWAY_REDIS_TIMEOUT": "15"}, auth=True)
    try:
        server.start(["--workers", "2"])
        wait_every_worker_serving(server, 2)  # "refused by every worker" needs both to take connections
        yield server, relay
    finally:
        server.stop()
        relay.stop()


def statuses(server: JetwayServer, token: str, count: int) -> List[int]:
    """``count`` reads, each on a fresh connection (they spread over the workers)."""
    headers = {"Authorization": f"Bearer {token}"}
    return [requests.get(server.url("/v1/users/x"), headers=headers, timeout=10).status_code for _ in range(count)]


def test_a_token_revoked_while_a_workers_lookup_of_it_is_held_is_refused_by_every_worker(relayed_server, own_redis):
    """End to end, revoked with the CLI: the raced worker answers the request in flight, then refuses the token."""
    server, relay = relayed_server
    for trial in range(1):
        name = f"raced-{trial}"
        token = make_token(own_redis.url, name, "read:*")
        relay.hold_at(token_key(digest_of(token)))
        raced: List[int] = []
        first = threading.Thread(target=lambda raced=raced, token=token: raced.extend(statuses(server, token, 1)))
        first.start()
        assert relay.holding.wait(10), "the lookup never went out"
        wait_until(lambda: relay.held_bytes() > 0, 10, "the lookup's reply, held")
        assert keys_cli(own_redis.url, "revoke", name).returncode == 0
        time.sleep(0.2)  # the revocation's message reaches both workers before the lookup's reply
        relay.release()
        first.join(10)
        assert raced == [404]  # the request in flight was admitted: it was sent before the revocation
        assert statuses(server, token, 20) == [401] * 20
        assert len(set(worker_pids(server))) == 2
