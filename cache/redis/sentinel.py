"""The master of a Sentinel-watched group, followed across failovers.

``SentinelLink`` is a ``RedisLink`` whose pool comes from txredisapi's
``Sentinel.master_for``: before every connection attempt it asks the
sentinels where the master is, and it drops a connection to a server whose
``ROLE`` is not master. When the master dies its connections drop, the pool
redials through the sentinels, and requests wait on the usual deadline
meanwhile, so the gateway answers 503 during the failover window and serves
again once the sentinels name the promoted replica, with no restart.

``MasterEndpoint`` dials the master the same way for the token cache's
subscription; that connection is rare and long-lived, so it asks the
sentinels with a short-lived ``Sentinel`` of its own.
"""

from __future__ import annotations

from typing import Any, Tuple

import txredisapi
from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from zope.interface import implementer

from cache.redis.address import RedisAddress
from cache.redis.link import ForgetsLostConnections, RedisLink, endpoint_for, pool_options
from cache.redis.resp import FastRedisProtocol

# txredisapi waits 10 s for a sentinel to name a healthy master before giving
# up on a connection attempt, and only then tries again; during a failover
# that delay would be added to the window, so the link asks again sooner.
DISCOVERY_TIMEOUT = 0.5


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
        return self.role().addCallback(check_role)


class _MasterFactory(ForgetsLostConnections, txredisapi.SentinelConnectionFactory):
    protocol = _MasterProtocol
    # As for one Redis (cache.redis.link): redial within a second, not after 10 s.
    maxDelay = 1.0


class _FactoryHandle:
    """Stands in for txredisapi's ConnectionHandler so ``master_for`` hands back the pool itself."""

    def __init__(self, factory: txredisapi.RedisFactory) -> None:
        self.factory = factory


def _sentinel(address: RedisAddress, timeout: float) -> txredisapi.Sentinel:
    sentinel = txredisapi.Sentinel(list(address.nodes), connectTimeout=timeout, replyTimeout=timeout)
    sentinel.discovery_timeout = min(DISCOVERY_TIMEOUT, timeout)
    return sentinel


class SentinelLink(RedisLink):
    """A ``RedisLink`` to whichever server the sentinels name master of ``address.service``."""

    def _start(self, address: RedisAddress, reactor: Any, timeout: float, poolsize: int) -> txredisapi.RedisFactory:
        self._sentinel = _sentinel(address, timeout)
        handle = self._sentinel.master_for(
            address.service,
            factory_class=_MasterFactory,
            dbid=address.db,
            poolsize=poolsize,
            handler=_FactoryHandle,
            **pool_options(address, timeout),
        )
        return handle.factory

    @defer.inlineCallbacks
    def close(self) -> Any:
        yield super().close()
        yield self._sentinel.disconnect()


@implementer(IStreamClientEndpoint)
class MasterEndpoint:
    """Dials the server the sentinels name master right now (for a subscription)."""

    def __init__(self, address: RedisAddress, reactor: Any, timeout: float) -> None:
        self._address = address
        self._reactor = reactor
        self._timeout = timeout

    @defer.inlineCallbacks
    def connect(self, factory: Any) -> Any:
        host, port = yield self._master()
        protocol = yield endpoint_for(self._address.at(host, port), self._reactor, self._timeout).connect(factory)
        return protocol

    @defer.inlineCallbacks
    def _master(self) -> Any:
        sentinel = _sentinel(self._address, self._timeout)
        try:
            found: Tuple[str, int] = yield sentinel.discover_master(self._address.service)
        finally:
            yield sentinel.disconnect()
        return found
