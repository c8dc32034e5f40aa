"""A relay in the test's own reactor between Jetway's Redis connections and Redis, that can hold Redis's replies.

For tests that need a certain order of events across two connections (a
reply held back while an invalidation comes on the other), run in a script
with a reactor (tests/cache/test_tracking.py). ``hold()`` keeps what Redis sends
until ``release()``; ``cut()`` drops every relayed connection; while
``refusing``, new connections are closed at once (a Redis that is gone).
"""

from __future__ import annotations

from typing import Any, List, Optional

from twisted.internet import protocol
from twisted.internet.endpoints import TCP4ServerEndpoint, UNIXClientEndpoint


class _ToRedis(protocol.Protocol):
    """The relay's side towards Redis: what Redis sends goes to the client, unless held."""

    client: _FromClient

    def dataReceived(self, data: bytes) -> None:
        relay = self.client.relay
        if relay.holding:
            relay.held.append((self.client, data))
            relay.held_bytes += len(data)
        else:
            self.client.transport.write(data)

    def connectionLost(self, reason: Any) -> None:
        self.client.transport.loseConnection()


class _FromClient(protocol.Protocol):
    relay: HoldingRelay

    def connectionMade(self) -> None:
        if self.relay.refusing:
            self.transport.abortConnection()
            return
        self.relay.connections.append(self)
        self.to_redis: Optional[_ToRedis] = None
        self.early: List[bytes] = []
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

    def connectionLost(self, reason: Any) -> None:
        if self in self.relay.connections:
            self.relay.connections.remove(self)
        if getattr(self, "to_redis", None) is not None:
            self.to_redis.transport.loseConnection()


class HoldingRelay:
    """Listens on 127.0.0.1:<port> and relays to the Redis on the unix socket ``target``."""

    def __init__(self, reactor: Any, target: str) -> None:
        self.reactor = reactor
        self.target = target
        self.holding = False
        self.refusing = False
        self.held: List[Any] = []
        self.held_bytes = 0
        self.connections: List[_FromClient] = []
        self.port = 0

    async def listen(self) -> HoldingRelay:
        factory = protocol.Factory.forProtocol(_FromClient)
        factory.buildProtocol = self._build  # type: ignore[method-assign]
        listening = await TCP4ServerEndpoint(self.reactor, 0, interface="127.0.0.1").listen(factory)
        self.port = listening.getHost().port
        return self

    def _build(self, addr: Any) -> _FromClient:
        relayed = _FromClient()
        relayed.relay = self
        return relayed

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold(self) -> None:
        self.holding = True

    def release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for client, data in held:
            client.transport.write(data)

    def cut(self) -> None:
        for client in list(self.connections):
            client.transport.abortConnection()
