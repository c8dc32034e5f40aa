"""A relay in the test's own reactor that delays what Redis sends by a set time, in order.

A slow or far network between a worker and Redis for the connections sent
through it (the hot cache's invalidations in tests/cache/test_invalidation_lag.py):
every chunk Redis sends is passed on ``delay`` seconds after it came, in the
order it came; what the client sends goes straight on. ``delay`` may be
changed at any time; a chunk keeps the delay it came with.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Optional, Tuple

from twisted.internet import protocol
from twisted.internet.endpoints import TCP4ServerEndpoint, UNIXClientEndpoint


class _ToRedis(protocol.Protocol):
    client: _FromClient

    def dataReceived(self, data: bytes) -> None:
        self.client.later(data)

    def connectionLost(self, reason: Any) -> None:
        self.client.transport.loseConnection()


class _FromClient(protocol.Protocol):
    relay: DelayRelay

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)
        self.to_redis: Optional[_ToRedis] = None
        self.queue: Deque[Tuple[float, bytes]] = deque()
        self.timer: Any = None
        self.transport.pauseProducing()
        factory = protocol.Factory.forProtocol(_ToRedis)
        UNIXClientEndpoint(self.relay.reactor, self.relay.target).connect(factory).addCallbacks(
            self._connected, lambda _: self.transport.abortConnection()
        )

    def _connected(self, to_redis: _ToRedis) -> None:
        to_redis.client = self
        self.to_redis = to_redis
        self.transport.resumeProducing()

    def dataReceived(self, data: bytes) -> None:
        assert self.to_redis is not None
        self.to_redis.transport.write(data)

    def later(self, data: bytes) -> None:
        clock = self.relay.reactor
        self.queue.append((clock.seconds() + self.relay.delay, data))
        if self.timer is None:
            self._schedule()

    def _schedule(self) -> None:
        due = self.queue[0][0]
        self.timer = self.relay.reactor.callLater(max(0.0, due - self.relay.reactor.seconds()), self._due)

    def _due(self) -> None:
        self.timer = None
        now = self.relay.reactor.seconds()
        while self.queue and self.queue[0][0] <= now:
            self.transport.write(self.queue.popleft()[1])
        if self.queue:
            self._schedule()

    def connectionLost(self, reason: Any) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        if self.to_redis is not None:
            self.to_redis.transport.loseConnection()


class DelayRelay:
    """Listens on 127.0.0.1:<port> and relays to the Redis on the unix socket ``target``."""

    def __init__(self, reactor: Any, target: str) -> None:
        self.reactor = reactor
        self.target = target
        self.delay = 0.0
        self.port = 0

    async def listen(self) -> DelayRelay:
        factory = protocol.Factory.forProtocol(_FromClient)
        factory.buildProtocol = self._build  # type: ignore[method-assign]
        listening = await TCP4ServerEndpoint(self.reactor, 0, interface="127.0.0.1").listen(factory)
        self.port = listening.getHost().port
        return self

    def _build(self, addr: Any) -> _FromClient:
        relayed = _FromClient()
        relayed.relay = self
        return relayed
