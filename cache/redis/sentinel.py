"""The master of a Sentinel-watched group, followed across failovers.

``SentinelLink`` is a ``RedisLink`` whose pool dials through a
``MasterEndpoint``: before every connection attempt it asks the sentinels
where the master is (``cache.redis.sentinel_watch``: the highest config
epoch wins), and it drops a connection to a server whose ``ROLE`` is not
master. When the master dies its connections drop, the pool redials through
the sentinels, and requests wait on the usual deadline meanwhile, so the
gateway answers 503 during the failover window and serves again once the
sentinels name the promoted replica, with no restart. When the sentinels
announce a failover (``SENTINEL FAILOVER``, or a master found down), the
worker's ``SentinelWatch`` drops every connection made through it at once,
those of the pools and of the subscriptions alike, so none goes on talking
to a demoted master that still takes writes; a ``READONLY`` reply drops the
link's connections too.

``MasterEndpoint`` dials the master the same way for the subscriptions (the
token and settings caches, the hot cache's tracking, the change feed).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import txredisapi
from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.python.failure import Failure
from zope.interface import implementer

from cache.redis.address import RedisAddress
from cache.redis.errors import RedisNotReady, RedisTimeout, RedisUnavailable
from cache.redis.link import Command, ForgetsLostConnections, RedisLink, endpoint_for, pool_options
from cache.redis.resp import FastRedisProtocol
from cache.redis.sentinel_watch import SentinelWatch, watch_of

# After a failover, how long a reply's timeout is still the failover's (the pools fill again,
# the new master's replicas sync, so a write concern's WAITs queue): 503, not 504.
SETTLING_SECONDS = 10.0
# Commands that only read (the documents', pages', indexes' and feed's reads): a batch of them
# alone is sent again after a failover that dropped its connection.
READS = frozenset(
    b"GET MGET HGET HMGET HGETALL EXISTS PTTL TTL SCAN ZRANGE ZRANGEBYLEX ZRANGEBYSCORE ZCARD ZSCORE"
    b" XRANGE XREVRANGE XLEN SMEMBERS SCARD PING".split()
)


class _MasterProtocol(FastRedisProtocol):
    """The link's protocol, checking first that the server is master, as txredisapi's SentinelRedisProtocol does.

    That one compares ROLE's reply with the str "master", but a pool with
    charset=None (raw bytes, as the store wants) gets b"master", so it would
    drop every connection. Same check, either type.
    """

    def connectionMade(self) -> Any:
        def check_role(role: Any) -> Any:
            if self.factory.is_master and role[0] not in (b"master", "master"):
                self.transport.loseConnection()
                return None
            return FastRedisProtocol.connectionMade(self)

        if self.password is not None:
            self.auth(self.password, self.username)
        return self.role().addCallback(check_role).addErrback(_lost)


def _lost(failure: Failure) -> None:
    """A connection lost before its ROLE came (dropped at a failover, or a server gone): nothing to report."""
    failure.trap(txredisapi.ConnectionError)


def _reads_only(commands: Sequence[Command]) -> bool:
    """Whether every command of a batch only reads: safe to send again whatever became of it."""
    return all(_name(command) in READS for command in commands)


def _name(command: Command) -> bytes:
    name = command[0]
    return (name.encode() if isinstance(name, str) else bytes(name)).upper()


def _as_unavailable(failure: Failure) -> Failure:
    if failure.check(RedisTimeout):
        raise RedisUnavailable(f"the master changed while Redis was answering ({failure.value})")
    return failure


class _MasterFactory(ForgetsLostConnections, txredisapi.SentinelConnectionFactory):
    protocol = _MasterProtocol
    # As for one Redis (cache.redis.link): redial within a second, not after 10 s.
    maxDelay = 1.0


class _FactoryHandle:
    """Stands in for txredisapi's ConnectionHandler so the factory's ``handler`` is harmless."""

    def __init__(self, factory: txredisapi.RedisFactory) -> None:
        self.factory = factory


class SentinelLink(RedisLink):
    """A ``RedisLink`` to whichever server the sentinels name master of ``address.service``."""

    def _start(self, address: RedisAddress, reactor: Any, timeout: float, poolsize: int) -> txredisapi.RedisFactory:
        self._watch = watch_of(address, reactor, timeout)
        factory = _MasterFactory(
            None,
            address.service,
            True,
            uuid=None,
            dbid=address.db,
            poolsize=poolsize,
            handler=_FactoryHandle,
            **pool_options(address, timeout),
        )
        factory.startConnecting(MasterEndpoint(address, reactor, timeout, self._watch))
        return factory

    def _send(self, commands: Sequence[Command], then: Callable[..., Any], *then_args: Any) -> defer.Deferred:
        sent = super()._send(commands, then, *then_args)
        return sent.addErrback(self._demoted, self._watch.generation, commands, then, then_args)

    def _demoted(
        self, failure: Failure, generation: int, commands: Sequence[Command], then: Callable[..., Any], then_args: Any
    ) -> Any:
        """What a failed batch becomes when the master may have changed under it.

        READONLY: the server this link writes to is a replica now; every
        connection is made again. A batch that failed across an announced
        failover (its connection dropped, or no reply in time) is sent once
        more, to the new master, when it only reads. Otherwise a timeout
        during a failover, or in the ``SETTLING_SECONDS`` after it (the pools
        fill again, a write concern's replicas sync, so WAITs queue), is
        RedisUnavailable (503 with Retry-After, which a client may retry), not
        RedisTimeout (504): the failover's doing, not a slow Redis's.
        """
        if failure.check(RedisNotReady) and str(failure.value).startswith("READONLY"):
            self._watch.suspect()
            return failure
        if not self._watch.unsettled(generation, SETTLING_SECONDS):
            return failure
        moved = generation != self._watch.generation
        if moved and failure.check(RedisUnavailable, RedisTimeout) and _reads_only(commands):
            return super()._send(commands, then, *then_args).addErrback(_as_unavailable)
        return _as_unavailable(failure)


@implementer(IStreamClientEndpoint)
class MasterEndpoint:
    """Dials the server the sentinels name master right now; its connections are dropped at a failover."""

    def __init__(
        self, address: RedisAddress, reactor: Any, timeout: float, watch: Optional[SentinelWatch] = None
    ) -> None:
        self._address = address
        self._reactor = reactor
        self._timeout = timeout
        self._watch = watch if watch is not None else watch_of(address, reactor, timeout)

    @defer.inlineCallbacks
    def connect(self, factory: Any) -> Any:
        generation, (host, port) = yield self._watch.master()
        protocol = yield endpoint_for(self._address.at(host, port), self._reactor, self._timeout).connect(factory)
        if not self._watch.opened(protocol, generation):
            protocol.transport.abortConnection()  # found before a failover was announced: maybe the old master
        return protocol
