"""The Redis a worker's warm-up talks to: fixed replies, in process, nothing stored.

``api.warm_up`` serves requests to a throwaway copy of the worker's
application before the worker takes a client's, so that PyPy compiles
the request path first. Its Redis must not be the real one: a warm-up
write would be a write of the user's data (replicated, in the change feed,
refused by a replica or a full Redis), and its token would have to be a
real one. This server listens on a loopback port and answers what that
application sends, with the replies a Redis gives, from fixed hashes:

- ``HMGET`` from ``hashes`` (the warm-up's token record and documents),
  ``PTTL`` as of a key that does not expire;
- ``EVALSHA`` (a document write) as "replaced", and, as Redis's
  broadcast tracking would, an invalidation of the script's first key to
  every connection subscribed to ``__redis__:invalidate``; ``WAIT`` (a
  write concern) as acknowledged by as many replicas as it asks;
- the set-up of the pool, the token and settings caches and the hot
  cache's tracking connection (``AUTH``, ``SELECT``, ``CLIENT``, ``ROLE``,
  ``SUBSCRIBE``, ``PING``).

Anything else gets an error reply, and ``unknown`` names it: the warm-up
reports it, so a path that starts asking something new is noticed, not
warmed on an error.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

from twisted.internet import protocol

from cache.hot.tracking import INVALIDATION_CHANNEL
from cache.redis.resp import Incomplete, parse_reply

Hashes = Dict[bytes, Dict[bytes, bytes]]

# What a write script answers for a document replaced (cache.documents.scripts.PUT).
_REPLACED = b":1\r\n"
_ROLE = b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"


def _bulk(value: Optional[bytes]) -> bytes:
    return b"$-1\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value)


def _array(items: List[bytes]) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(items)


class WarmUpRedis(protocol.Factory):
    """Fixed replies to what the warm-up's application sends (the module's docstring says which)."""

    def __init__(self, hashes: Hashes) -> None:
        self.hashes = hashes
        self.unknown: Set[bytes] = set()
        self.invalidation_subscribers: List[_Replies] = []

    def buildProtocol(self, addr: object) -> _Replies:
        replies = _Replies()
        replies.factory = self
        return replies


class _Replies(protocol.Protocol):
    factory: WarmUpRedis

    def connectionMade(self) -> None:
        self.transport.setTcpNoDelay(True)  # as Redis does
        self._buffer = b""
        self._subscriptions = 0

    def connectionLost(self, reason: object) -> None:
        if self in self.factory.invalidation_subscribers:
            self.factory.invalidation_subscribers.remove(self)

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        pos = 0
        answers = []
        while pos < len(self._buffer):
            try:
                command, pos = parse_reply(self._buffer, pos)
            except Incomplete:
                break
            answers.append(self._answer(command))
        self._buffer = self._buffer[pos:]
        if answers:
            self.transport.write(b"".join(answers))

    def _answer(self, command: List[bytes]) -> bytes:
        name = command[0].upper()
        if name == b"HMGET":
            fields = self.factory.hashes.get(command[1], {})
            return _array([_bulk(fields.get(field)) for field in command[2:]])
        if name == b"PTTL":  # no expiry (-1), or no such key (-2)
            return b":-1\r\n" if command[1] in self.factory.hashes else b":-2\r\n"
        if name == b"EVALSHA":
            self._invalidate(command[3])
            return _REPLACED
        if name == b"WAIT":  # as many replicas as the write concern asks
            return b":%d\r\n" % int(command[1])
        if name == b"SUBSCRIBE":
            return b"".join(self._subscribe(channel) for channel in command[1:])
        if name == b"PING":
            return _array([_bulk(b"pong"), _bulk(b"")]) if self._subscriptions else b"+PONG\r\n"
        if name == b"ROLE":
            return _ROLE
        if name == b"CLIENT" and command[1].upper() == b"ID":
            return b":%d\r\n" % id(self)
        if name in (b"AUTH", b"SELECT", b"CLIENT"):
            return b"+OK\r\n"
        self.factory.unknown.add(name)
        return b"-ERR the warm-up's Redis does not answer " + name + b"\r\n"

    def _subscribe(self, channel: bytes) -> bytes:
        self._subscriptions += 1
        if channel == INVALIDATION_CHANNEL:
            self.factory.invalidation_subscribers.append(self)
        return _array([_bulk(b"subscribe"), _bulk(channel), b":%d\r\n" % self._subscriptions])

    def _invalidate(self, key: bytes) -> None:
        message = _array([_bulk(b"message"), _bulk(INVALIDATION_CHANNEL), _array([_bulk(key)])])
        for subscriber in self.factory.invalidation_subscribers:
            subscriber.transport.write(message)
