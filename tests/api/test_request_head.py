"""api.request_head: header names a client sends are normalized as Cyclone does, in bounded memory."""

from __future__ import annotations

import os

import pytest
from cyclone.httputil import HTTPHeaders
from hypothesis import example, given, settings
from hypothesis import strategies as st

from api import request_head
from api.request_head import MAX_KNOWN_NAMES, ProtocolError, RepeatedHeads, normal_name, parse_head


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


# Bytes a head's parts are drawn from: every rule's edge (controls, DEL,
# high bytes, separators, colons, spaces and tabs, CR and LF alone).
_EDGES = b'aZ09-_!~: \t\x00\x08\x09\x0a\x0d\x1f\x7f\x80\xff"(),/;=?@[]{}'
_parts = st.binary(max_size=12).map(lambda raw: bytes(_EDGES[byte % len(_EDGES)] for byte in raw))
_names = st.one_of(st.sampled_from([b"Host", b"content-length", b"Connection", b"x-a"]), _parts)
_lines = st.lists(st.tuples(_names, _parts).map(lambda pair: pair[0] + b":" + pair[1]) | _parts, max_size=6)
_request_lines = st.one_of(
    st.sampled_from([b"GET /v1/a/b HTTP/1.1", b"HEAD / HTTP/1.0", b"GET / HTTP/2.0", b"GET / HTTP/1.7"]),
    st.tuples(_parts, _parts, _parts).map(b" ".join),
)


def _outcome(parse, *args):
    try:
        head = parse(*args)
    except request_head.ProtocolError as refused:
        return refused.status, refused.detail
    if isinstance(head, tuple):
        return head
    return head.method, head.target, head.version, sorted(head.headers.get_all()), head.content_length, head.keep_alive


@settings(max_examples=1000, deadline=None)
@given(_request_lines, _lines)
@pytest.mark.slow
def test_a_head_parses_alike_before_and_after_its_lines_are_known(request_line, lines):
    """A line remembered parses as its checks parse it; a line refused is not remembered."""
    block = b"\r\n".join([request_line, *lines])
    request_head._KNOWN_LINES.clear()
    first = _outcome(parse_head, block)
    assert _outcome(parse_head, block) == first
    repeated = RepeatedHeads()  # a connection's: once parsed, then remembered
    assert _outcome(repeated.parse, block) == _outcome(repeated.parse, block) == first
    for line in request_head._KNOWN_LINES:
        assert request_head.known_line(line) == request_head._KNOWN_LINES[line]
    if first[0] == 400 and "header" in first[1]:
        assert len(request_head._KNOWN_LINES) < len(lines)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(_request_lines, st.binary(max_size=40)))
@pytest.mark.slow
def test_a_request_line_parses_as_the_pattern_parses_it(line):
    """The common methods' lines take no pattern, and are read exactly as the pattern reads them."""
    assert _outcome(request_head._request_line, line) == _outcome(request_head.request_line_by_pattern, line)


@pytest.mark.parametrize(
    "line",
    [
        b"GET /a HTTP/1.1",
        b"GET /a\x7f HTTP/1.1",
        b"GET /\ta HTTP/1.1",
        b"GET  HTTP/1.1",
        b"GET /\xe9 HTTP/1.1",
        b"PROPFIND /a HTTP/1.1",
        b"GET /a HTTP/1.7",
        b"GET /a HTTP/2.0",
        b"get /a HTTP/1.1",
        b"GET /a  HTTP/1.1",
    ],
)
def test_the_edges_of_a_request_line(line):
    assert _outcome(request_head._request_line, line) == _outcome(request_head.request_line_by_pattern, line)


def test_made_up_header_lines_do_not_grow_the_worker():
    for _ in range(30):
        lines = b"\r\n".join(b"X-Trace: %s" % os.urandom(16).hex().encode() for _ in range(100))
        parse_head(b"GET / HTTP/1.1\r\n" + lines)
    assert 0 < len(request_head._KNOWN_LINES) <= request_head.MAX_KNOWN_LINES
    long_line = b"X-Long: " + b"a" * request_head.MAX_KNOWN_LINE_LENGTH
    assert parse_head(b"GET / HTTP/1.1\r\n" + long_line).headers["X-Long"] == "a" * request_head.MAX_KNOWN_LINE_LENGTH
    assert long_line not in request_head._KNOWN_LINES


_lengths = st.lists(
    st.integers(min_value=0, max_value=10**20).map(str) | st.text(alphabet="0123456789 ,+-x\u0663", max_size=22),
    min_size=1,
    max_size=3,
)


@settings(max_examples=1000, deadline=None)
@given(_lengths)
@example(["9" * 18])
@example(["1" * 19])
@example(["0012"])
@example(["\u0663"])
@example(["12", "12"])
@pytest.mark.slow
def test_a_content_length_reads_as_its_rules_read_it(values):
    """The one-plain-number shortcut gives what the full rules give, and refuses nothing they accept."""
    headers = request_head.RequestHeaders()
    for value in values:
        headers.add_normal("Content-Length", value)
    assert _length(request_head._content_length, headers) == _length(request_head.content_length_by_rules, headers)


def _length(read, headers):
    try:
        return read(headers)
    except request_head.ProtocolError as refused:
        return refused.status, refused.detail


def test_a_connections_repeated_head_is_parsed_once_and_each_request_has_its_own_headers():
    heads = RepeatedHeads()
    block = b"GET /v1/a/b HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"j" * 1500
    first = heads.parse(block)
    first.headers["X-Added"] = "by a handler"
    again = heads.parse(bytes(block))  # equal bytes, another object: what the next read hands over
    assert again.headers is not first.headers and "X-Added" not in again.headers
    assert again.headers["Authorization"] == "Bearer " + "j" * 1500 and again.target == "/v1/a/b"
    other = heads.parse(b"PUT /v1/a/c HTTP/1.1\r\nHost: x\r\nContent-Length: 2")
    assert (other.method, other.target, other.content_length) == ("PUT", "/v1/a/c", 2)
    bad = b"GET / HTTP/1.1\r\nHost x"
    for _ in range(2):  # refused each time: a refused head is never remembered
        with pytest.raises(ProtocolError):
            heads.parse(bad)
    assert heads.parse(block).target == "/v1/a/b"


_crlf_soup = st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b"x", b":", b" "]), max_size=12).map(b"".join)


@settings(max_examples=2000, deadline=None)
@given(_crlf_soup, _crlf_soup)
@pytest.mark.slow
def test_a_repeated_heads_end_is_where_a_search_finds_it(first, then):
    """``repeated_end`` answers only where ``find`` would, whatever the bytes (CR and LF near the joins)."""
    heads = RepeatedHeads()
    data = b"GET / HTTP/1.1\r\nX: 1" + first + b"\r\n\r\n"
    try:
        heads.parse(data[: data.find(b"\r\n\r\n")])
    except ProtocolError:
        return
    for candidate in (data + then, data[:-1] + then, then + data):
        end = heads.repeated_end(candidate)
        assert end == -1 or end == candidate.find(b"\r\n\r\n")
    assert heads.repeated_end(data + then) == data.find(b"\r\n\r\n")
