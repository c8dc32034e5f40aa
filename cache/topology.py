"""Which link ``REDIS_URL`` calls for: one Redis, a Sentinel group, or a Cluster.

The rest of the code sees a ``cache.link.Link`` and never asks which.
"""

from __future__ import annotations

from typing import Any

from cache.address import CLUSTER, SENTINEL, RedisAddress
from cache.cluster import AnyNodeEndpoint, ClusterLink
from cache.hot_cache import HotCache
from cache.link import Link, RedisLink, endpoint_for
from cache.sentinel import MasterEndpoint, SentinelLink
from cache.tracking import InvalidationFeed, Tracker


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


def invalidation_feed(
    address: RedisAddress, link: Any, cache: HotCache, reactor: Any, timeout: float
) -> InvalidationFeed:
    """The hot cache's invalidations from every master ``link`` writes to: one
    server, the master the sentinels name (a replica is refused), or each master
    of a cluster, following ``link``'s slot map."""

    def tracker(name: str, endpoint: Any, require_master: bool = False) -> Tracker:
        return Tracker(name, endpoint, feed, reactor, timeout, address.password, address.username, require_master)

    if address.kind == CLUSTER:
        feed = InvalidationFeed(cache, on_trouble=lambda: link.refresh().addErrback(lambda _: None))

        def follow(masters: Any) -> None:
            feed.follow(
                masters, lambda node: tracker(f"{node[0]}:{node[1]}", endpoint_for(address.at(*node), reactor, timeout))
            )

        link.watch(follow, feed.void)
        return feed
    feed = InvalidationFeed(cache)
    if address.kind == SENTINEL:
        feed.add("master", tracker(address.describe(), MasterEndpoint(address, reactor, timeout), require_master=True))
    else:
        feed.add("server", tracker(address.describe(), endpoint_for(address, reactor, timeout)))
    return feed
