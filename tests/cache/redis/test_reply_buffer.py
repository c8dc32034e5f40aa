"""cache.redis.reply_buffer and the Redis protocol reading into it: whole replies, however the bytes arrive."""

from __future__ import annotations

import socket
from typing import Iterator, List, Tuple

import pytest
from twisted.internet import main, reactor, tcp
from twisted.internet.testing import StringTransport

from cache.redis.reply_buffer import READ_SIZE, ReplyBuffer
from cache.redis.resp import FastRedisProtocol
from tests.cache.redis.test_resp import STREAM, comparable, parse_all

EXPECTED = comparable(parse_all(STREAM))


@pytest.fixture
def socket_pair() -> Iterator[Tuple[socket.socket, socket.socket]]:
    peer, ours = socket.socketpair()
    ours.setblocking(False)
    yield peer, ours
    peer.close()
    ours.close()


def test_receive_appends_and_consume_keeps_the_rest_at_the_front(socket_pair):
    peer, ours = socket_pair
    inbox = ReplyBuffer(16)
    peer.sendall(b"0123456789")
    assert inbox.receive(ours) == 10
    inbox.consume(4)
    assert bytes(inbox.data[: inbox.end]) == b"456789"
    peer.sendall(b"abc")
    inbox.receive(ours)
    assert bytes(inbox.data[: inbox.end]) == b"456789abc"


def test_a_message_larger_than_the_buffer_grows_it_and_the_buffer_shrinks_once_empty(socket_pair):
    peer, ours = socket_pair
    inbox = ReplyBuffer(16)
    message = bytes(range(256)) * 4
    peer.sendall(message)
    while inbox.end < len(message):
        inbox.receive(ours)
    assert bytes(inbox.data[: inbox.end]) == message
    assert len(inbox.data) >= len(message)
    inbox.consume(inbox.end)
    assert inbox.end == 0 and len(inbox.data) == 16


def test_append_grows_to_fit_and_an_empty_read_is_the_end_of_the_stream(socket_pair):
    peer, ours = socket_pair
    inbox = ReplyBuffer(8)
    inbox.append(b"x" * 5)
    inbox.append(b"y" * 20)
    assert bytes(inbox.data[: inbox.end]) == b"x" * 5 + b"y" * 20
    with pytest.raises(BlockingIOError):
        inbox.receive(ours)  # nothing sent yet
    peer.close()
    assert inbox.receive(ours) == 0


class Replies:
    """A FastRedisProtocol over ``transport``, with one batch of ``count`` commands waiting."""

    def __init__(self, transport_for, count: int) -> None:
        self.protocol = FastRedisProtocol(charset=None, convertNumbers=False)
        self.transport = transport_for(self.protocol)
        self.protocol.makeConnection(self.transport)
        self.transport.write = lambda data: None  # the commands need not reach a peer
        self.got: List = []
        self.protocol.send([[b"PING"]] * count).addCallback(self.got.append)


def test_a_socket_transport_reads_into_the_reply_buffer_and_any_cut_gives_the_same_replies(socket_pair):
    peer, ours = socket_pair
    for cut in range(1, len(STREAM)):
        replies = Replies(lambda protocol: tcp.Connection(ours, protocol, reactor), len(EXPECTED))
        assert replies.transport.doRead == replies.protocol._read_replies
        for piece in (STREAM[:cut], STREAM[cut:]):
            peer.sendall(piece)
            assert replies.transport.doRead() is None
        assert [comparable(r) for r in replies.got] == [EXPECTED], cut


def test_values_are_copies_that_later_reads_leave_alone(socket_pair):
    peer, ours = socket_pair
    replies = Replies(lambda protocol: tcp.Connection(ours, protocol, reactor), 3)
    first = b"$5\r\nfirst\r\n"
    peer.sendall(first + b"$6\r\nsec")  # the second reply is cut, and stays in the buffer
    replies.transport.doRead()
    peer.sendall(b"ond\r\n$" + b"%d\r\n" % READ_SIZE + b"z" * READ_SIZE + b"\r\n")
    while not replies.got:
        replies.transport.doRead()
    assert replies.got == [[b"first", b"second", b"z" * READ_SIZE]]
    assert len(replies.protocol._inbox.data) == READ_SIZE  # grown for the large value, shrunk after it


def test_nothing_to_read_is_no_event_and_a_closed_peer_is_the_end(socket_pair):
    peer, ours = socket_pair
    replies = Replies(lambda protocol: tcp.Connection(ours, protocol, reactor), 1)
    assert replies.transport.doRead() is None  # nothing yet
    peer.close()
    assert replies.transport.doRead() is main.CONNECTION_DONE


def test_other_transports_hand_over_bytes_and_give_the_same_replies():
    replies = Replies(lambda protocol: StringTransport(), len(EXPECTED))
    assert "doRead" not in vars(replies.transport)
    for byte in STREAM:
        replies.protocol.dataReceived(bytes([byte]))
    assert [comparable(r) for r in replies.got] == [EXPECTED]


def test_an_unreadable_stream_fails_the_batch_and_drops_the_connection():
    replies = Replies(lambda protocol: StringTransport(), 2)
    failures: List = []
    replies.protocol._batches[0].deferred.addErrback(failures.append)
    replies.protocol.dataReceived(b"+OK\r\n!bogus\r\n")
    assert failures and "unknown reply type" in str(failures[0].value)
    assert replies.transport.disconnecting
    assert replies.protocol._inbox.end == 0
