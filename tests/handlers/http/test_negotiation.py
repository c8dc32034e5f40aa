"""handlers.http.negotiation: Accept-Encoding weighed as RFC 9110 12.5.3 says."""

import pytest

from handlers.http.negotiation import AS_STORED, IDENTITY, Negotiator, choose

GZIP = (("gzip", b"..."),)


@pytest.mark.parametrize(
    ("header", "stored", "expected"),
    [
        (None, GZIP, IDENTITY),  # no header: the stored bytes, as before variants existed
        ("", GZIP, IDENTITY),  # an empty header wants no coding
        ("gzip", GZIP, "gzip"),
        ("gzip", (), IDENTITY),  # identity stays acceptable unless refused
        ("gzip, deflate, br, zstd", GZIP, "gzip"),
        ("GZIP;Q=1.0", GZIP, "gzip"),
        ("gzip;q=0", GZIP, IDENTITY),
        ("gzip;q=0.5, identity", GZIP, IDENTITY),  # identity weighs more
        ("identity;q=0.5, gzip;q=0.5", GZIP, "gzip"),  # equal weights: the server's order
        ("*", GZIP, "gzip"),
        ("*;q=0, identity", GZIP, IDENTITY),
        ("identity;q=0, gzip", GZIP, "gzip"),
        ("identity;q=0", GZIP, None),  # refuses identity and names nothing stored
        ("identity;q=0", (), None),
        ("*;q=0", (), None),
        ("*;q=0", GZIP, None),
        ("br;q=1, identity;q=0", GZIP, None),
        ("gzip;q=bogus", GZIP, "gzip"),  # a malformed weight counts as 1
        (" gzip ; q=0.8 , , identity;q=0.1", GZIP, "gzip"),
    ],
)
def test_the_best_acceptable_stored_coding_is_chosen(header, stored, expected):
    assert choose(Negotiator().preference(header), stored) == expected


def test_no_header_means_the_stored_bytes():
    assert Negotiator().preference(None) == AS_STORED


def test_parsed_headers_are_remembered_and_bounded():
    negotiator = Negotiator()
    first = negotiator.preference("gzip, deflate")
    assert negotiator.preference("gzip, deflate") is first
    for n in range(1000):
        negotiator.preference(f"gzip;q=0.{n % 10}, x-{n}")
    assert len(negotiator._remembered) <= 256
