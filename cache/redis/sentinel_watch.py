"""Sentinel's failovers followed by every connection of a worker at once.

The sentinels are asked where the master is only when a connection is
opened, and a master demoted by a failover that is still running is still
a writable master (``ROLE`` says so) until the sentinels turn it into a
replica, seconds after ``SENTINEL FAILOVER``. Connections opened before
a failover kept writing to it and reading from it meanwhile: acknowledged
writes lost, deleted documents read again, reads alternating between two
versions (issue #56). So one ``SentinelWatch`` per worker subscribes to
every sentinel's announcements and acts on them for every connection made
through it (``MasterEndpoint``: the pools, the hot cache's tracking, the
token and settings caches' and the change feed's subscriptions):

- ``+failover-state-send-slaveof-noone`` (the leading sentinel is about to
  make a replica master): every connection to the master is dropped and
  none is made (a *fence*) until the failover ends, so no command reaches
  the old master once a second one may exist. Requests wait for a
  connection on their usual deadline, and answer 503 with ``Retry-After``
  if the failover takes longer.
- ``+switch-master`` (the failover is done): the fence is lifted and every
  connection dropped again, so that each is made anew to the new master.
- A failover aborted (``-failover-abort-*``), or no end within
  ``FENCE_SECONDS``: the fence is lifted and the master asked again.

Where the master is: every sentinel is asked (``SENTINEL MASTERS``) and the
answer with the highest ``config-epoch`` wins, so a sentinel that has not
yet heard of the failover cannot send a connection back to the old master;
a connection whose address was found before an announcement is dropped as
soon as it is made. A ``READONLY`` reply on a link (``SentinelLink``) drops
its connections too (``suspect``): the server it writes to was demoted.
What this promises, with and without a write concern: docs/operations.md,
"Scaling Redis".
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

import txredisapi
from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import defer, protocol, task
from twisted.internet.endpoints import HostnameEndpoint
from twisted.logger import Logger

from cache.redis.address import RedisAddress
from cache.redis.errors import RedisUnavailable
from cache.redis.resp import encode_command
from cache.redis.subscription import PingedSubscription

FENCE = b"+failover-state-send-slaveof-noone"
SWITCH = b"+switch-master"
ABORTS = (
    b"-failover-abort-not-elected",
    b"-failover-abort-slave-timeout",
    b"-failover-abort-no-good-slave",
    b"+failover-end-for-timeout",
)
# Longest a fence holds without the failover's end announced (Sentinel's own
# promotion wait is a few seconds; its failover-timeout, 3 minutes, too long).
FENCE_SECONDS = 10.0
# How long the sentinels that have not answered are waited for, after the first answer.
ANSWER_WINDOW = 0.2
# At most one drop for a READONLY reply per this many seconds.
SUSPECT_SECONDS = 0.5
PING_SECONDS = 2.0
# How often the sentinels are asked again whether the master is still the one the connections were made
# to: an announcement missed (no sentinel subscribed yet, or all of them unreachable) is noticed so.
RECHECK_SECONDS = 1.0
RETRY = backoffPolicy(initialDelay=0.2, maxDelay=1.0, factor=2.0, jitter=lambda: 0.0)
_log = Logger()
Master = Tuple[str, int]


class _Announcements(PingedSubscription):
    """One sentinel's subscription to the failover announcements."""

    watch: SentinelWatch

    def connectionMade(self) -> None:
        super().connectionMade()
        self.watch._subscribers.add(self)
        self.transport.write(encode_command((b"SUBSCRIBE", FENCE, SWITCH, *ABORTS)))

    def reply(self, reply: Any) -> None:
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
            self.watch.announced(reply[1], reply[2])
        elif isinstance(reply, list) and reply and reply[0] == b"pong":
            self.ponged()

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        self.watch._subscribers.discard(self)


class SentinelWatch:
    """The master of ``address.service``, and every connection made to it, followed across failovers.

    ``follow``: subscribe to the sentinels' announcements (a worker's shared
    watch); without it, only the discovery (a one-off command's link).
    """

    def __init__(self, address: RedisAddress, reactor: Any, timeout: float, follow: bool = True) -> None:
        self.address = address
        self.service = (address.service or "").encode()
        self._reactor = reactor
        self._timeout = timeout
        # Bumped by every announcement that drops the connections: a master found before it is stale.
        self.generation = 0
        self.changed_at = float("-inf")  # when it was last bumped, on the reactor's clock
        self.switches = 0
        self.fenced = False
        self._fence_timer: Any = None
        self._lifted: List[defer.Deferred] = []
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last_switch: Optional[bytes] = None
        self.current: Optional[Master] = None  # the master the connections were last made to
        self._rechecking = False
        self._last_suspect = float("-inf")
        self._subscribers: weakref.WeakSet[_Announcements] = weakref.WeakSet()
        self._services: List[ClientService] = []
        self._sentinel: Optional[txredisapi.Sentinel] = None
        if follow:
            self._sentinel = _sentinel(address, timeout)
            self._follow()

    def _follow(self) -> None:
        for host, port in self.address.nodes:
            factory = protocol.Factory.forProtocol(_Announcements)
            factory.noisy = False
            factory.buildProtocol = self._build  # type: ignore[method-assign]
            endpoint = HostnameEndpoint(self._reactor, host, port, timeout=self._timeout)
            service = ClientService(endpoint, factory, retryPolicy=RETRY, clock=self._reactor)
            service.startService()
            self._services.append(service)
        self._pinging = task.LoopingCall(self._ping)
        self._pinging.clock = self._reactor
        self._pinging.start(PING_SECONDS, now=False)
        self._rechecks = task.LoopingCall(self._recheck)
        self._rechecks.clock = self._reactor
        self._rechecks.start(RECHECK_SECONDS, now=False)

    def _build(self, addr: Any) -> _Announcements:
        subscriber = _Announcements()
        subscriber.watch = self
        return subscriber

    def _ping(self) -> None:
        for subscriber in list(self._subscribers):
            subscriber.ping()

    @defer.inlineCallbacks
    def stop(self) -> Any:
        if self._services:
            self._pinging.stop()
            self._rechecks.stop()
        self._lift()
        yield defer.gatherResults([service.stopService() for service in self._services], consumeErrors=True)
        if self._sentinel is not None:
            yield self._sentinel.disconnect()

    # --- announcements

    def announced(self, channel: bytes, message: bytes) -> None:
        """A sentinel's message on ``channel``; those about another master are ignored."""
        words = message.split()
        if channel == SWITCH:
            if words[:1] != [self.service] or len(words) != 5:
                return
            if message == self._last_switch and not self.fenced:
                return  # every sentinel announces it: the first one was acted on
            self._last_switch = message
            self.switches += 1
            self.current = (words[3].decode(), int(words[4]))  # what the recheck compares with, until a dial
            _log.warn("sentinel: {service} switched master: {message}", service=self.address.service, message=message)
            self.drop()  # before the lift: the discoveries it lets go find the master of the new generation
            self._lift()
            return
        name = words[words.index(b"@") + 1] if b"@" in words else (words[1] if len(words) > 1 else b"")
        if name != self.service:
            return
        if channel == FENCE:
            _log.warn("sentinel: {service} failing over: no command to the old master", service=self.address.service)
            self.fenced = True
            self._last_switch = None
            if self._fence_timer is None:
                self._fence_timer = self._reactor.callLater(FENCE_SECONDS, self._lift_and_drop)
            self.drop()
        elif channel in ABORTS and self.fenced:
            self._lift_and_drop()

    def _lift_and_drop(self) -> None:
        self._fence_timer = None
        self.drop()
        self._lift()

    def _lift(self) -> None:
        self.fenced = False
        if self._fence_timer is not None and self._fence_timer.active():
            self._fence_timer.cancel()
        self._fence_timer = None
        lifted, self._lifted = self._lifted, []
        for waiting in lifted:
            waiting.callback(None)

    def drop(self) -> None:
        """Every connection made through the watch is dropped; each is made again to the master found then."""
        self.generation += 1
        self.changed_at = self._reactor.seconds()
        for connection in list(self._connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abortConnection()

    def unsettled(self, generation: int, within: float) -> bool:
        """Whether the master may have changed since ``generation``, or did less than ``within`` seconds ago."""
        return generation != self.generation or self.fenced or self._reactor.seconds() - self.changed_at < within

    def suspect(self) -> None:
        """A link was told READONLY: its server is no master now. Dropped, at most every ``SUSPECT_SECONDS``."""
        now = self._reactor.seconds()
        if now - self._last_suspect >= SUSPECT_SECONDS:
            self._last_suspect = now
            self.drop()

    # --- discovery

    @defer.inlineCallbacks
    def master(self) -> Any:
        """``(generation, (host, port))``: where the master is now, once no failover is under way."""
        if self.fenced:
            lifted: defer.Deferred = defer.Deferred()
            self._lifted.append(lifted)
            yield lifted
        generation = self.generation
        sentinel = self._sentinel or _sentinel(self.address, self._timeout)
        try:
            found = yield self._ask(sentinel)
        finally:
            if sentinel is not self._sentinel:
                yield sentinel.disconnect()
        if generation == self.generation:
            self.current = found
        return generation, found

    def _recheck(self) -> None:
        if self.fenced or self._rechecking or self.current is None or self._sentinel is None:
            return
        self._rechecking = True
        asked = self._ask(self._sentinel).addCallback(self._compare, self.generation)
        asked.addErrback(lambda _: None).addBoth(self._rechecked)

    def _rechecked(self, _: Any) -> None:
        self._rechecking = False

    def _compare(self, found: Master, generation: int) -> None:
        """The sentinels name another master than the connections' though no announcement came: follow them."""
        if found != self.current and generation == self.generation and not self.fenced:
            _log.warn(
                "sentinel: {service} is at {found}, not {current}: a failover not heard of",
                service=self.address.service,
                found=found,
                current=self.current,
            )
            self.current = found
            self.drop()

    def opened(self, connection: Any, generation: int) -> bool:
        """A connection made to the master found at ``generation``; False (drop it) if an announcement came since."""
        if generation != self.generation or self.fenced:
            return False
        self._connections.add(connection)
        return True

    def _ask(self, sentinel: txredisapi.Sentinel) -> defer.Deferred:
        """The master named by the sentinel with the highest config epoch among those that answer in time."""
        result: defer.Deferred = defer.Deferred()
        answers: List[Tuple[int, Master]] = []
        left = [len(sentinel.sentinels)]
        timers: Dict[str, Any] = {}

        def settle() -> None:
            if result.called:
                return
            for timer in timers.values():
                if timer.active():
                    timer.cancel()
            if answers:
                result.callback(max(answers)[1])
            else:
                result.errback(RedisUnavailable(f"no sentinel names a master of {self.address.service}"))

        def answered(masters: Dict[str, Any]) -> None:
            state = masters.get(self.address.service)
            if state and sentinel.check_master_state(state):
                answers.append((int(state.get("config-epoch", 0)), (state["ip"], int(state["port"]))))
                if "window" not in timers:
                    timers["window"] = self._reactor.callLater(ANSWER_WINDOW, settle)

        def done(_: Any) -> None:
            left[0] -= 1
            if left[0] == 0:
                settle()

        for one in sentinel.sentinels:
            one.sentinel_masters().addCallbacks(answered, lambda _: None).addBoth(done)
        timers["deadline"] = self._reactor.callLater(self._timeout, settle)
        return result


def _sentinel(address: RedisAddress, timeout: float) -> txredisapi.Sentinel:
    return txredisapi.Sentinel(list(address.nodes), connectTimeout=timeout, replyTimeout=timeout)


def watch_of(address: RedisAddress, reactor: Any, timeout: float) -> SentinelWatch:
    """The worker's shared watch that ``address`` carries, or one that only finds the master."""
    shared: Optional[SentinelWatch] = address.watch
    return shared if shared is not None else SentinelWatch(address, reactor, timeout, follow=False)
