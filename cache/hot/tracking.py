"""Redis's invalidations for the hot cache: one tracking connection per Redis master.

Each ``Tracker`` keeps one connection to one server that asks Redis to tell
it of every change to a key under ``TRACKED_PREFIX`` (RESP2 client-side
caching in broadcasting mode, redirected to the connection itself)::

    CLIENT ID                                   -> n
    CLIENT TRACKING ON REDIRECT n BCAST PREFIX jw:{
    SUBSCRIBE __redis__:invalidate

and hands every key it is told of to the ``HotCache``; a null payload (a
``FLUSHALL`` or ``FLUSHDB``) empties it. Broadcasting rather than Redis's
default mode (which remembers the keys each connection read): no data
connection needs tracking, none has to be set up again when this one's id
changes, and Redis does no bookkeeping per read (docs/operations.md, "The hot
cache"; its measurements in docs/performance.md).

The cache is live only while every tracker the topology needs
(``InvalidationFeed``) is subscribed. A tracker that loses its connection,
or whose ``PING`` is not answered within the link's timeout, takes the cache
down with it until it is subscribed again.

**The heartbeat: how late an invalidation can be.** Being subscribed is not
enough: an invalidation travels on its own connection, and nothing makes it
arrive before the acknowledgement of its write reaches a client on another
connection (a retransmission, a busy relay, Redis on another host: with the
invalidations held back a few milliseconds, a read was served after the
newer write was acknowledged elsewhere, issue #56). So each tracker sends a ``PING`` on
its subscription every ``max_lag / 4`` (the one command a RESP2 subscriber
may send), stamped with the time it was sent, and a hit is served only
while the stamp of the last one answered is less than ``max_lag`` old
(``HotCache.confirm``). Why a pong bounds the invalidations: Redis runs
commands one at a time, and in each turn of its event loop it queues the
turn's broadcast invalidations on the tracking connection *before* it sends
any client its replies (``beforeSleep``: ``trackingBroadcastInvalidationMessages``,
then ``handleClientsWithPendingWrites``). A write acknowledged to anyone
before Redis read the ``PING`` therefore had its invalidation queued on this
connection ahead of the pong, and TCP delivers in order: once the pong of a
``PING`` sent at ``t`` is read, every write acknowledged before ``t`` has
been invalidated here (invalidations are handled before the pong in the same
read). A hit at ``now`` is served only while ``now - t <= max_lag``, so what
it returns was current at some moment within ``max_lag`` before ``now``. The
cost: one 14-byte ``PING`` and its pong per tracker every ``max_lag / 4``
while the cache is read, nothing on the read path but one clock read and a
comparison.

**Only while the cache is read.** A worker nobody reads from would spend a
round of the reactor per ``PING`` for nothing (80 a second at the default
bound). So a tracker keeps the bound's pace while the cache was consulted in
the last ``IDLE_AFTER`` seconds and pings once every ``PING_INTERVAL`` after
(liveness: a dead server is still noticed). The first read of a held entry
after an idle spell finds its confirmation too old: it goes to Redis, as any
lagging read does, and wakes the trackers (``HotCache.on_lagging``), which
ping at once and go back to the bound's pace; the reads after the pong hit.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional

from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from cache import keys
from cache.hot.cache import HotCache
from cache.redis.address import CLUSTER, SENTINEL, RedisAddress
from cache.redis.link import endpoint_for
from cache.redis.resp import Incomplete, encode_command, encode_commands, parse_reply
from cache.redis.sentinel import MasterEndpoint

# Every document key starts so (cache.keys). So do index and token keys,
# whose invalidations find no entry and cost a dict lookup each.
TRACKED_PREFIX = keys.PREFIX + b"{"
INVALIDATION_CHANNEL = b"__redis__:invalidate"
CONNECTION_NAME = b"jetway-hot-cache"
# Between PINGs with no bound on the lag (max_lag None) or while idle; else max_lag / HEARTBEATS_PER_BOUND.
PING_INTERVAL = 1.0
HEARTBEATS_PER_BOUND = 4
# A cache not consulted for this long is idle: its trackers ping every PING_INTERVAL. Long
# enough that a worker read every few seconds keeps its hits; a shorter spell saves little.
IDLE_AFTER = 10.0
# Between connection attempts, as the links redial (cache.redis.link).
RETRY_DELAYS = (0.2, 1.0)
_log = Logger()

Reply = Any
_PING = encode_command((b"PING",))


class _TrackingProtocol(Protocol):
    """One tracking connection: set up, then invalidations and pongs."""

    tracker: Tracker

    def connectionMade(self) -> None:
        try:
            self._fd = self.transport.fileno()
        except AttributeError:  # a TLS transport: its requests come in the order the poll gives
            self._fd = -1
        read_first = getattr(self.tracker.clock, "read_first", None)
        if read_first is not None and self._fd >= 0:
            # Invalidations before the requests that came in the same poll (api/event_loop.py).
            read_first(self._fd)
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)  # a PING waits for no acknowledgement (Nagle): its round trip is the lag measured
        self._buffer = b""
        self._expected: Deque[Callable[[Reply], None]] = deque()
        self.subscribed = False
        self.setup_since = self.tracker.stamp()
        # The send times of the PINGs not yet answered, oldest first (the cache's clock).
        self._pings: Deque[float] = deque()
        setup = []
        if self.tracker.password is not None:
            auth = (self.tracker.username, self.tracker.password) if self.tracker.username else (self.tracker.password,)
            setup.append(((b"AUTH", *auth), self._ok))
        setup.append(((b"CLIENT", b"SETNAME", CONNECTION_NAME), self._ok))
        if self.tracker.require_master:
            setup.append(((b"ROLE",), self._master))
        setup.append(((b"CLIENT", b"ID"), self._track))
        self._send(setup)

    def _send(self, commands: List[Any]) -> None:
        self.transport.write(encode_commands([command for command, _ in commands]))
        self._expected.extend(expect for _, expect in commands)

    def dataReceived(self, data: bytes) -> None:
        self._buffer = self._buffer + data if self._buffer else data
        pos = 0
        while pos < len(self._buffer):
            try:
                reply, pos = parse_reply(self._buffer, pos)
            except Incomplete:
                break
            except Exception:  # a stream we cannot read is a connection we cannot trust
                self.transport.abortConnection()
                return
            self._reply(reply)
        self._buffer = self._buffer[pos:]

    def _reply(self, reply: Reply) -> None:
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
            self.tracker.invalidated(reply[2])
            return
        if isinstance(reply, list) and reply and reply[0] == b"pong":
            if self._pings:
                self.tracker.heard(self._pings.popleft())
            return
        if not self._expected:
            return
        self._expected.popleft()(reply)

    def _refuse(self, why: str) -> None:
        self.tracker.refused(why)
        self.transport.loseConnection()

    def _ok(self, reply: Reply) -> None:
        if reply != "OK":
            self._refuse(f"setup failed: {reply}")

    def _master(self, reply: Reply) -> None:
        if not isinstance(reply, list) or reply[0] != b"master":
            self._refuse("the server is not a master")

    def _track(self, reply: Reply) -> None:
        if not isinstance(reply, int):
            self._refuse(f"CLIENT ID failed: {reply}")
            return
        track = (b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", reply, b"BCAST", b"PREFIX", TRACKED_PREFIX)
        self._send([(track, self._ok), ((b"SUBSCRIBE", INVALIDATION_CHANNEL), self._subscribed)])

    def _subscribed(self, reply: Reply) -> None:
        if not (isinstance(reply, list) and reply[0] == b"subscribe"):
            self._refuse(f"SUBSCRIBE failed: {reply}")
            return
        self.subscribed = True
        self.tracker.subscribed(self)
        self.ping(self.tracker.stamp(), self.tracker.timeout)  # the first confirmation, at once

    def ping(self, now: float, timeout: float) -> None:
        """Send a PING stamped ``now``, or drop the connection if the oldest one (or the setup) is overdue."""
        overdue = self._pings[0] if self._pings else (None if self.subscribed else self.setup_since)
        if overdue is not None and now - overdue > timeout:
            self.tracker.refused(f"no answer in {timeout:g} s")
            self.transport.abortConnection()
            return
        if self.subscribed:
            self._pings.append(now)
            self.transport.write(_PING)

    def connectionLost(self, reason: Any) -> None:
        read_first = getattr(self.tracker.clock, "read_first", None)
        if read_first is not None and self._fd >= 0:
            read_first(self._fd, False)
        self.tracker.lost(self)


class Tracker:
    """One server's tracking connection, redialled whenever it is lost.

    ``endpoint`` dials the server (``MasterEndpoint`` asks the sentinels
    first); ``require_master`` drops a server whose ``ROLE`` is not master.
    """

    def __init__(
        self,
        name: str,
        endpoint: Any,
        feed: InvalidationFeed,
        reactor: Any,
        timeout: float,
        password: Optional[str] = None,
        username: Optional[str] = None,
        require_master: bool = False,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.feed = feed
        self.clock = reactor
        self.timeout = timeout
        self.password = password
        self.username = username
        self.require_master = require_master
        self.live: Optional[_TrackingProtocol] = None
        # The send time of the last PING answered on the live connection (None: none yet), and its round trip.
        self.confirmed_at: Optional[float] = None
        self.lag = 0.0
        self.stamp: Callable[[], float] = feed.cache.now
        max_lag = feed.cache.max_lag
        self.heartbeat = PING_INTERVAL if max_lag is None else max_lag / HEARTBEATS_PER_BOUND
        self._connection: Optional[_TrackingProtocol] = None
        self._failures = 0
        self._stopped = False
        self._retry: Any = None
        self._next_ping: Any = None

    @property
    def is_subscribed(self) -> bool:
        return self.live is not None

    def start(self) -> None:
        self._schedule_ping()
        self._dial()

    def stop(self) -> None:
        self._stopped = True
        if self._next_ping is not None and self._next_ping.active():
            self._next_ping.cancel()
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        if self._connection is not None:
            self._connection.transport.abortConnection()

    def _dial(self) -> None:
        self._retry = None
        if self._stopped:
            return
        factory = Factory.forProtocol(_TrackingProtocol)
        factory.buildProtocol = self._build  # type: ignore[method-assign]
        connecting = self.endpoint.connect(factory)
        connecting.addErrback(self._failed)

    def _build(self, addr: Any) -> _TrackingProtocol:
        protocol = _TrackingProtocol()
        protocol.tracker = self
        self._connection = protocol
        return protocol

    def _failed(self, failure: Any) -> None:
        self.refused(f"cannot connect ({failure.getErrorMessage()})")
        self._redial()

    def _redial(self) -> None:
        if self._stopped or self._retry is not None:
            return
        delay = RETRY_DELAYS[min(self._failures, len(RETRY_DELAYS) - 1)]
        self._failures += 1
        self._retry = self.clock.callLater(delay, self._dial)

    def _ping(self) -> None:
        self._next_ping = None
        if self._connection is not None:
            self._connection.ping(self.stamp(), self.timeout)
        self._schedule_ping()

    def _schedule_ping(self) -> None:
        if self._stopped:
            return
        pace = self.heartbeat if self.feed.in_demand() else max(self.heartbeat, PING_INTERVAL)
        self._next_ping = self.clock.callLater(pace, self._ping)

    def wake(self) -> None:
        """A read found the confirmation too old: ping now, unless the next PING is due within the bound's pace."""
        due = self._next_ping
        if due is None or not due.active() or due.getTime() - self.clock.seconds() <= self.heartbeat:
            return
        due.cancel()
        self._ping()

    def subscribed(self, protocol: _TrackingProtocol) -> None:
        self._failures = 0
        self.live = protocol
        self.confirmed_at = None
        self.feed.tracker_up(self)

    def heard(self, sent_at: float) -> None:
        """The pong of a PING sent at ``sent_at``: every invalidation queued before it has been handled."""
        self.lag = self.stamp() - sent_at
        self.confirmed_at = sent_at
        self.feed.confirmed()

    def invalidated(self, message: Any) -> None:
        self.feed.invalidated(message)

    def refused(self, why: str) -> None:
        self.feed.tracker_trouble(self, why)

    def lost(self, protocol: _TrackingProtocol) -> None:
        if self._connection is protocol:
            self._connection = None
        if self.live is protocol:
            self.live = None
            self.confirmed_at = None
        self.feed.tracker_down(self)
        self._redial()


class InvalidationFeed:
    """The trackers the cache depends on: it is live while every one of them is subscribed.

    One tracker for one server or a Sentinel group's master; one per master
    of a cluster, following its slot map (``follow``): a change of the map
    empties the cache, and a tracker in trouble makes the cluster link reload
    the map (``on_trouble``), so a master replaced by its replica is noticed
    even when no request asks for its slots.
    """

    def __init__(self, cache: HotCache, on_trouble: Optional[Callable[[], Any]] = None) -> None:
        self.cache = cache
        self.trackers: Dict[Any, Tracker] = {}
        self._on_trouble = on_trouble
        self._was_live = False
        self._bypassed = False  # a warning said so: its end is said at info (a first start is debug)
        # The cache's read count when last looked at, and when it last changed (the cache's clock).
        self._reads_seen = -1
        self._read_at = float("-inf")
        cache.on_lagging = self.wake

    def in_demand(self) -> bool:
        """Whether the cache was consulted in the last ``IDLE_AFTER`` seconds (the trackers' pace)."""
        cache = self.cache
        reads = cache.hits + cache.misses + cache.lagging
        if reads != self._reads_seen:
            self._reads_seen = reads
            self._read_at = cache.now()
        return cache.now() - self._read_at < IDLE_AFTER

    def wake(self) -> None:
        """A read of a held entry found the confirmation too old: every tracker pings now."""
        self._read_at = self.cache.now()
        for tracker in self.trackers.values():
            tracker.wake()

    def add(self, node: Any, tracker: Tracker) -> None:
        self.trackers[node] = tracker
        self._settle()
        tracker.start()

    def remove(self, node: Any) -> None:
        tracker = self.trackers.pop(node, None)
        if tracker is not None:
            tracker.stop()
        self._settle()

    def follow(self, nodes: Iterable[Any], make: Callable[[Any], Tracker]) -> None:
        """Trackers for exactly ``nodes`` (the cluster's masters), the cache emptied: the map changed."""
        wanted = list(nodes)
        self.cache.reset()
        for node in [node for node in self.trackers if node not in wanted]:
            self.remove(node)
        for node in wanted:
            if node not in self.trackers:
                self.add(node, make(node))

    def void(self) -> None:
        """A redirection: no read in flight may fill (its reply may come from a node not yet tracked)."""
        self.cache.void()

    def stop(self) -> None:
        for tracker in self.trackers.values():
            tracker.stop()
        self.cache.down()

    def invalidated(self, message: Any) -> None:
        if message is None:
            self.cache.invalidate(None)
        else:
            self.cache.invalidate([key for key in message if isinstance(key, bytes)])

    def tracker_up(self, tracker: Tracker) -> None:
        self._settle()

    def confirmed(self) -> None:
        """A tracker's pong: hits are served until the oldest confirmation of all trackers plus the bound."""
        oldest: Optional[float] = None
        for tracker in self.trackers.values():
            if tracker.confirmed_at is None:
                return  # one master's invalidations unconfirmed: nothing changes (it is down or new)
            if oldest is None or tracker.confirmed_at < oldest:
                oldest = tracker.confirmed_at
        if self.cache.live:
            self.cache.confirm(oldest)

    def tracker_down(self, tracker: Tracker) -> None:
        self._settle()
        if self._on_trouble is not None:
            self._on_trouble()

    def tracker_trouble(self, tracker: Tracker, why: str) -> None:
        if self._was_live:
            _log.warn("hot cache: invalidation connection to {server}: {why}", server=tracker.name, why=why)
        if self._on_trouble is not None:
            self._on_trouble()

    def _settle(self) -> None:
        live = bool(self.trackers) and all(tracker.is_subscribed for tracker in self.trackers.values())
        if live and not self.cache.live:
            self.cache.up()
            (_log.info if self._bypassed else _log.debug)(
                "hot cache: live ({count} invalidation connections)", count=len(self.trackers)
            )
        elif not live:
            if self.cache.live:
                _log.warn("hot cache: bypassed until every invalidation connection is up again")
                self._bypassed = True
            self.cache.down()
        self._was_live = live


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
