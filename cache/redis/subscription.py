"""A connection subscribed to channels, kept honest by PING: the base of every subscriber the driver keeps.

A subscribed connection hears nothing while nothing is published, so a dead
peer (or a network that silently dropped it) looks like a quiet one. Its
owner calls ``ping`` on a timer: a PING still unanswered at the next one
aborts the connection, and its owner dials again. Replies are parsed as
they arrive (``cache.redis.resp``) and handed to ``reply`` one by one; a
stream that cannot be parsed aborts the connection too.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import protocol

from cache.redis.resp import Incomplete, encode_command, parse_reply


class PingedSubscription(protocol.Protocol):
    """Parses replies into ``reply``; ``ping`` checks the peer still answers."""

    def connectionMade(self) -> None:
        self._inbox = bytearray()
        self._awaiting_pong = False

    def ping(self) -> None:
        if self._awaiting_pong:
            self.transport.abortConnection()  # the last one is still unanswered: dial again
            return
        self._awaiting_pong = True
        self.transport.write(encode_command([b"PING"]))

    def ponged(self) -> None:
        """The peer answered the PING (a subclass's ``reply`` calls it on a PONG, in whichever form it comes)."""
        self._awaiting_pong = False

    def dataReceived(self, data: bytes) -> None:
        self._inbox += data
        pos = 0
        try:
            while pos < len(self._inbox):
                reply, pos = parse_reply(self._inbox, pos)
                self.reply(reply)
        except Incomplete:
            pass
        except ValueError:
            self.transport.abortConnection()
            return
        del self._inbox[:pos]

    def reply(self, reply: Any) -> None:
        raise NotImplementedError
