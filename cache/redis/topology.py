"""Which link ``REDIS_URL`` calls for: one Redis, a Sentinel group, or a Cluster.

The rest of the code sees a ``cache.redis.link.Link`` and never asks which.
The hot cache's invalidations follow the same choice
(``cache.hot.tracking.invalidation_feed``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cache.redis.address import CLUSTER, SENTINEL, RedisAddress
from cache.redis.cluster import AnyNodeEndpoint, ClusterLink
from cache.redis.link import Link, RedisLink, endpoint_for
from cache.redis.sentinel import MasterEndpoint, SentinelLink
from cache.redis.sentinel_watch import SentinelWatch


def connect(address: RedisAddress, reactor: Any, timeout: float, poolsize: int = 4, spread: bool = False) -> Link:
    """A link to ``address``; ``poolsize`` connections per server it talks to (``spread``: see ``RedisLink``)."""
    if address.kind == SENTINEL:
        return SentinelLink(address, reactor, timeout, poolsize, spread)
    if address.kind == CLUSTER:
        return ClusterLink(address, reactor, timeout, poolsize, spread)
    return RedisLink(address, reactor, timeout, poolsize, spread)


def subscriber_endpoint(address: RedisAddress, reactor: Any, timeout: float) -> Any:
    """Where to ``SUBSCRIBE``: the master (its replicas get every ``PUBLISH`` too,
    but a demoted master that lost touch would not), or any node of a cluster
    (which forwards every ``PUBLISH`` to all nodes)."""
    if address.kind == SENTINEL:
        return MasterEndpoint(address, reactor, timeout)
    if address.kind == CLUSTER:
        return AnyNodeEndpoint(address, reactor, timeout)
    return endpoint_for(address, reactor, timeout)


def watched(address: RedisAddress, reactor: Any, timeout: float) -> RedisAddress:
    """``address`` carrying a ``SentinelWatch`` that every link and subscription made with it
    shares (a Sentinel group's: one subscription to the sentinels per worker); others unchanged.
    Its ``watch.stop()`` ends it."""
    if address.kind != SENTINEL or address.watch is not None:
        return address
    return replace(address, watch=SentinelWatch(address, reactor, timeout))
