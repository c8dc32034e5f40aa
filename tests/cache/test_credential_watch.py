"""cache.credentials.watch alone, on a task.Clock: which holds end, when, and what it costs in lookups.

The token cache in front of it is a table of records that counts lookups,
because what is checked here is the watch's bookkeeping (how many lookups
a revocation or a lost subscription costs); tests/handlers/feed/test_stream_credentials.py
runs the same against a real server and Redis.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

from twisted.internet import defer, task

from cache.credentials.tokens import TokenRecord
from cache.credentials.watch import RECHECK_SECONDS, CredentialWatch

NOW = 1_000_000.0


class Tokens:
    """What the watch asks of ``cache.credentials.token_cache.TokenCache``, from a dict; lookups counted."""

    def __init__(self, clock: task.Clock) -> None:
        self.reactor = clock
        self.records: Dict[bytes, TokenRecord] = {}
        self.cache: Dict[bytes, TokenRecord] = {}
        self.subscribed = True
        self.lookups: List[bytes] = []
        self.failing = False
        self.listeners: List[Callable[[Optional[bytes]], None]] = []

    def on_change(self, listener: Callable[[Optional[bytes]], None]) -> None:
        self.listeners.append(listener)

    def cached(self, digest: bytes) -> Optional[TokenRecord]:
        return self.cache.get(digest) if self.subscribed else None

    def lookup(self, digest: bytes) -> defer.Deferred:
        self.lookups.append(digest)
        if self.failing:
            return defer.fail(ConnectionError("Redis does not answer"))
        return defer.succeed(self.records.get(digest))

    def tell(self, digest: Optional[bytes]) -> None:
        for listener in self.listeners:
            listener(digest)


def record(name: str, expires: int = 0) -> TokenRecord:
    return TokenRecord(name.encode() * 4, name, ("read:*",), "", expires, 0)


def setup(*records: TokenRecord):
    clock = task.Clock()
    clock.advance(NOW)
    tokens = Tokens(clock)
    for each in records:
        tokens.records[each.digest] = tokens.cache[each.digest] = each
    return clock, tokens, CredentialWatch(tokens, clock.seconds)  # type: ignore[arg-type]


def test_a_revocation_ends_every_hold_of_that_token_and_no_other_without_a_lookup():
    alice, bob = record("alice"), record("bob")
    clock, tokens, watch = setup(alice, bob)
    ended: List[str] = []
    for _ in range(1000):
        watch.hold(alice, lambda why: ended.append("alice " + why))
        watch.hold(bob, lambda why: ended.append("bob " + why))
    tokens.tell(alice.digest)
    assert ended == ["alice token-revoked"] * 1000
    assert tokens.lookups == [], "a revocation costs no Redis call per stream"
    assert len(watch) == 1000


def test_a_hold_ends_at_the_earlier_of_its_token_and_ticket_expiry_and_not_before():
    token = record("t", expires=int(NOW) + 10)
    clock, _, watch = setup(token)
    ended: List[str] = []
    watch.hold(token, ended.append, ticket_expires=int(NOW) + 5)
    watch.hold(token, ended.append, ticket_expires=int(NOW) + 20)
    watch.hold(token, ended.append)
    clock.advance(4.99)
    assert ended == []
    clock.advance(0.01)
    assert ended == ["ticket-expired"]
    clock.advance(5)
    assert ended == ["ticket-expired", "token-expired", "token-expired"]
    assert len(watch) == 0


def test_a_released_hold_never_ends_and_leaves_no_timer():
    token = record("t", expires=int(NOW) + 10)
    clock, tokens, watch = setup(token)
    ended: List[str] = []
    watch.hold(token, ended.append).release()
    tokens.tell(token.digest)
    clock.advance(20)
    assert ended == [] and clock.getDelayedCalls() == [] and len(watch) == 0


def test_a_hold_the_token_cache_does_not_vouch_for_is_looked_up_once():
    """Its request's lookup may have been overtaken by the revocation (not kept): Redis says it is gone."""
    token = record("t")
    _, tokens, watch = setup()
    ended: List[str] = []
    watch.hold(token, ended.append)
    assert tokens.lookups == [token.digest] and ended == ["token-revoked"]


def test_while_unsubscribed_each_held_token_is_looked_up_once_per_recheck_and_a_gone_one_ends():
    alice, bob = record("alice"), record("bob")
    clock, tokens, watch = setup(alice, bob)
    ended: List[str] = []
    for _ in range(500):
        watch.hold(alice, ended.append)
        watch.hold(bob, lambda why: ended.append("bob"))
    tokens.subscribed = False
    tokens.tell(None)  # the subscription went down
    assert sorted(tokens.lookups) == [alice.digest, bob.digest]
    del tokens.records[alice.digest]  # revoked, its message unheard
    clock.advance(RECHECK_SECONDS)
    assert ended == ["token-revoked"] * 500
    assert len(tokens.lookups) == 4
    tokens.subscribed = True
    tokens.tell(None)  # back: one more look, then the rechecks stop
    clock.advance(RECHECK_SECONDS * 4)
    assert len(tokens.lookups) == 5 and ended.count("bob") == 0


def test_a_lookup_that_fails_ends_nothing():
    token = record("t")
    clock, tokens, watch = setup(token)
    ended: List[str] = []
    watch.hold(token, ended.append)
    tokens.subscribed, tokens.failing = False, True
    tokens.tell(None)
    clock.pump([RECHECK_SECONDS] * 3)
    assert ended == [] and len(tokens.lookups) == 4


def test_a_watch_made_while_unsubscribed_rechecks_its_holds_until_subscribed():
    alice = record("alice")
    clock, tokens, _ = setup(alice)
    tokens.subscribed = False  # went down before the first stream made the watch (Gate makes it lazily)
    watch = CredentialWatch(tokens, clock.seconds)  # type: ignore[arg-type]
    ended: List[str] = []
    watch.hold(alice, ended.append)
    del tokens.records[alice.digest]  # revoked; the message goes unheard
    clock.advance(RECHECK_SECONDS)
    assert ended == ["token-revoked"]
