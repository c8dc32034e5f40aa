"""cache.codec: strict RFC 8259 parsing, compact serialization."""

import pytest

from cache import codec


@pytest.mark.parametrize("text", [b"NaN", b'{"a":Infinity}', b'{"a":-Infinity}', b"{'a':1}", b'{"a":1,}', b""])
def test_rejects_what_rfc_8259_does_not_allow(text):
    with pytest.raises(codec.JsonError):
        codec.loads(text)


def test_rejects_invalid_utf8_and_a_byte_order_mark():
    with pytest.raises(codec.JsonError, match="UTF-8"):
        codec.loads(b'{"a":"\xff"}')
    with pytest.raises(codec.JsonError):
        codec.loads(b'\xef\xbb\xbf{"a":1}')


def test_parses_big_numbers_exactly():
    assert codec.loads(b'{"n":123456789012345678901234567890}') == {"n": 123456789012345678901234567890}


def test_dumps_is_compact_utf8_without_escaped_slashes():
    assert codec.dumps({"a": "é/", "b": [1, 2.5, None, True]}) == '{"a":"é/","b":[1,2.5,null,true]}'.encode()


def test_dumps_refuses_non_finite_numbers():
    with pytest.raises(codec.JsonError):
        codec.dumps({"a": float("inf")})
