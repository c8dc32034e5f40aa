"""One worker's subscription to the change-feed nudges of the collections it follows.

The write scripts PUBLISH ``<shard> <stream id>`` on a collection's channel
(``cache.feed.streams``) with every event. A worker keeps one subscriber
connection (not one per client, nor a blocking read per stream) and
subscribes to the channels of the collections its clients follow; a nudge
tells it which shard to read.

Nudges are hints, never the data: a message lost (pub/sub is
fire-and-forget; a dropped connection loses what was sent meanwhile; a
cluster forwards PUBLISH over its bus, where order across nodes is not
kept) delays an event but cannot lose it. So the owner is told when the
subscription is (re)established, and reads every followed collection from
where it was then (``handlers.feed.feed``), and it sweeps them anyway. A PING
every ``PING_SECONDS`` that goes unanswered by the next one drops a
connection that died silently.

Its own small RESP client (``cache.redis.resp.parse_reply``) rather than
txredisapi's ``SubscriberProtocol``: that one matches the confirmations of a
``SUBSCRIBE`` of several channels to whatever command waits next.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import defer, protocol, task

from cache.feed.position import StreamId, parse_id
from cache.feed.streams import CHANNEL_PREFIX, channel
from cache.redis.address import RedisAddress
from cache.redis.resp import encode_command, encode_commands
from cache.redis.subscription import PingedSubscription
from cache.redis.topology import subscriber_endpoint

PING_SECONDS = 5.0
# Redis coming back should be noticed within a second or so (as cache.redis.link).
RETRY = backoffPolicy(initialDelay=0.2, maxDelay=1.0, factor=2.0, jitter=lambda: 0.0)

OnNudge = Callable[[bytes, int, StreamId], None]


class _Protocol(PingedSubscription):
    owner: FeedNudges

    def connectionMade(self) -> None:
        super().connectionMade()
        self.owner._connected = self
        self._unconfirmed: Set[bytes] = set()
        address = self.owner.address
        commands: List[List[Any]] = []
        if address.password is not None:
            commands.append([b"AUTH", *([address.username] if address.username else []), address.password])
        followed = sorted(self.owner.followed)
        if followed:
            self._unconfirmed = set(followed)
            commands.append([b"SUBSCRIBE", *[channel(name) for name in followed]])
        if commands:
            self.transport.write(encode_commands(commands))
        if not followed:
            self.owner._up(self)

    def subscribe(self, collection: bytes) -> None:
        self.transport.write(encode_command([b"SUBSCRIBE", channel(collection)]))

    def unsubscribe(self, collection: bytes) -> None:
        self.transport.write(encode_command([b"UNSUBSCRIBE", channel(collection)]))

    def reply(self, reply: Any) -> None:
        if isinstance(reply, Exception):
            self.transport.loseConnection()  # AUTH refused, or a command we did not mean
            return
        if reply == "PONG":  # PING's answer while no channel is subscribed
            self.ponged()
            return
        if not isinstance(reply, list) or len(reply) < 2:
            return  # AUTH's +OK
        kind = reply[0]
        if kind == b"message" and len(reply) == 3:
            self.owner._message(reply[1], reply[2])
        elif kind == b"subscribe":
            collection = reply[1][len(CHANNEL_PREFIX) :]
            self.owner._confirmed(collection)
            if self._unconfirmed:
                self._unconfirmed.discard(collection)
                if not self._unconfirmed:
                    self.owner._up(self)
        elif kind == b"pong":
            self.ponged()

    def connectionLost(self, reason: Any = protocol.connectionDone) -> None:
        self.owner._down(self)


class FeedNudges:
    """Follows collections' channels on one connection; calls ``on_nudge`` and ``on_up``.

    ``on_up`` runs each time the subscription is established with every
    followed channel confirmed: whatever was published while it was down is
    lost, so the owner reads what it follows again.
    """

    def __init__(
        self, address: RedisAddress, reactor: Any, timeout: float, on_nudge: OnNudge, on_up: Callable[[], None]
    ) -> None:
        self.address = address
        self.followed: Set[bytes] = set()
        self._on_nudge = on_nudge
        self._on_up = on_up
        self._connected: Optional[_Protocol] = None  # connected, maybe not yet confirmed
        self._live: Optional[_Protocol] = None  # every followed channel confirmed
        self._waiting: Dict[bytes, List[defer.Deferred]] = {}
        factory = protocol.Factory.forProtocol(_Protocol)
        factory.noisy = False  # a line per reconnect says nothing the ClientService does not
        factory.buildProtocol = self._build  # type: ignore[method-assign]
        self._service = ClientService(
            subscriber_endpoint(address, reactor, timeout), factory, retryPolicy=RETRY, clock=reactor
        )
        self._service.startService()
        self._pinging = task.LoopingCall(self._ping)
        self._pinging.clock = reactor
        self._pinging.start(PING_SECONDS, now=False)

    @property
    def up(self) -> bool:
        return self._live is not None

    def follow(self, collection: bytes) -> defer.Deferred:
        """Subscribe to ``collection``'s nudges; fires once Redis confirms (at once while down)."""
        self.followed.add(collection)
        if self._connected is not None:
            self._connected.subscribe(collection)
        if self._live is None:
            return defer.succeed(None)  # everything followed is read again once the connection is up
        confirmed: defer.Deferred = defer.Deferred()
        self._waiting.setdefault(collection, []).append(confirmed)
        return confirmed

    def unfollow(self, collection: bytes) -> None:
        self.followed.discard(collection)
        if self._connected is not None:
            self._connected.unsubscribe(collection)

    def close(self) -> defer.Deferred:
        if self._pinging.running:
            self._pinging.stop()
        return self._service.stopService()

    def _build(self, addr: Any) -> _Protocol:
        built = _Protocol()
        built.owner = self
        return built

    def _ping(self) -> None:
        if self._live is not None:
            self._live.ping()

    def _message(self, channel_name: bytes, message: bytes) -> None:
        shard, _, stream_id = message.partition(b" ")
        try:
            nudge = (int(shard, 16), parse_id(stream_id))
        except ValueError:
            return  # not one of ours
        self._on_nudge(channel_name[len(CHANNEL_PREFIX) :], *nudge)

    def _confirmed(self, collection: bytes) -> None:
        for confirmed in self._waiting.pop(collection, []):
            confirmed.callback(None)

    def _up(self, live: _Protocol) -> None:
        self._live = live
        self._on_up()

    def _down(self, lost: _Protocol) -> None:
        if self._connected is lost:
            self._connected = None
        if self._live is lost:
            self._live = None
        # Nobody waits on a confirmation that will not come: the reconnect reads again.
        waiting, self._waiting = self._waiting, {}
        for deferreds in waiting.values():
            for confirmed in deferreds:
                confirmed.callback(None)
