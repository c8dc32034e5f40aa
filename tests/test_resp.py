"""cache.resp: whole RESP replies, however the bytes are split."""

import pytest
import txredisapi

from cache.resp import Incomplete, parse_reply

STREAM = (
    b"+OK\r\n"
    b":42\r\n"
    b"$5\r\nhe\r\nl\r\n"  # a bulk string holding CRLF
    b"$-1\r\n"
    b"*3\r\n$1\r\na\r\n$-1\r\n*2\r\n:1\r\n-ERR nested\r\n"
    b"*-1\r\n"
    b"$0\r\n\r\n"
    b"-NOSCRIPT No matching script\r\n"
)


def parse_all(buffer: bytes) -> list:
    replies, pos = [], 0
    while pos < len(buffer):
        reply, pos = parse_reply(buffer, pos)
        replies.append(reply)
    return replies


def test_every_reply_type():
    replies = parse_all(STREAM)
    assert replies[:4] == ["OK", 42, b"he\r\nl", None]
    items = replies[4]
    assert items[:2] == [b"a", None] and items[2][0] == 1
    assert isinstance(items[2][1], txredisapi.ResponseError) and str(items[2][1]) == "ERR nested"
    assert replies[5:7] == [None, b""]
    assert isinstance(replies[7], txredisapi.ResponseError) and str(replies[7]).startswith("NOSCRIPT")


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_a_reply_cut_anywhere_is_incomplete_never_wrong(cut):
    """Parsing a prefix yields whole replies, then Incomplete; never a partial reply."""
    head = STREAM[:cut]
    done, pos = [], 0
    with pytest.raises(Incomplete):
        while True:
            reply, pos = parse_reply(head, pos)
            done.append(reply)
            if pos == len(head):
                raise Incomplete()
    assert comparable(done) == comparable(parse_all(STREAM)[: len(done)])


def comparable(value):
    """Errors compare by type and text (exceptions are never equal to each other)."""
    if isinstance(value, list):
        return [comparable(item) for item in value]
    if isinstance(value, Exception):
        return (type(value).__name__, str(value))
    return value
