"""api.request_head: header names a client sends are normalized as Cyclone does, in bounded memory."""

from __future__ import annotations

import os

import pytest
from cyclone.httputil import HTTPHeaders

from api import request_head
from api.request_head import MAX_KNOWN_NAMES, normal_name, parse_head


@pytest.mark.parametrize(
    "name", ["content-type", "CONTENT-TYPE", "Content-Type", "x-request-id", "X-Forwarded-For", "a", "dnt"]
)
def test_a_name_is_normalized_as_cyclone_does(name):
    assert normal_name(name) == HTTPHeaders._normalize_name(name)


def test_repeated_headers_are_joined_and_listed_as_cyclone_does():
    head = parse_head(b"GET / HTTP/1.1\r\nhost: a\r\nx-a: 1\r\nX-A: 2\r\nAccept: */*")
    assert head.headers["X-A"] == "1,2"
    assert head.headers.get_list("x-a") == ["1", "2"]
    assert head.headers.get("HOST") == "a"
    assert sorted(head.headers.get_all()) == [("Accept", "*/*"), ("Host", "a"), ("X-A", "1"), ("X-A", "2")]


def test_made_up_header_names_do_not_grow_the_worker():
    """100,000 distinct names: Cyclone's class-wide cache of names and ours stay as they were, or bounded."""
    cyclone_names = len(HTTPHeaders._normalized_headers)
    for _ in range(1000):
        lines = b"\r\n".join(b"x-%s: 1" % os.urandom(8).hex().encode() for _ in range(100))
        head = parse_head(b"GET / HTTP/1.1\r\n" + lines)
        assert len(head.headers) == 100
    assert len(HTTPHeaders._normalized_headers) <= cyclone_names + 10  # the server's own lookups only
    assert len(request_head._KNOWN_NAMES) <= MAX_KNOWN_NAMES
