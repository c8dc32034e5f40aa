"""cache.credentials.issuers: the issuers file read into ``Issuer`` values, and every bad member named."""

from __future__ import annotations

import json

import pytest

from cache.credentials.issuers import DEFAULT_ALGORITHMS, Issuer, IssuerConfigError, load_issuers, url_problem

GOOD = {"issuer": "https://id.example.com/realms/shop", "audience": "jetway"}


def written(tmp_path, document, raw=None):
    path = tmp_path / "issuers.json"
    path.write_bytes(raw if raw is not None else json.dumps(document).encode())
    return str(path)


def refusal(tmp_path, **member):
    """The message for GOOD with ``member`` changed (None: removed)."""
    entry = {**GOOD, **member}
    entry = {name: value for name, value in entry.items() if value is not None}
    path = written(tmp_path, {"issuers": [entry]})
    with pytest.raises(IssuerConfigError) as refused:
        load_issuers(path)
    message = str(refused.value)
    assert message.startswith(path + ": issuers[0]"), message
    return message


def test_the_two_required_members_make_an_issuer_with_the_documented_defaults(tmp_path):
    (issuer,) = load_issuers(written(tmp_path, {"issuers": [GOOD]}))
    assert issuer == Issuer("https://id.example.com/realms/shop", "jetway")
    assert issuer.algorithms == DEFAULT_ALGORITHMS == ("RS256", "ES256")
    assert (issuer.leeway_seconds, issuer.scope_claim, issuer.scope_prefix, issuer.grants) == (30, "scope", "", ())
    assert (issuer.subject_claim, issuer.refresh_seconds, issuer.jwks_uri) == ("sub", 60, None)
    assert (issuer.max_jwks_bytes, issuer.fetch_timeout_seconds) == (256 * 1024, 5.0)
    assert issuer.discovery_uri == "https://id.example.com/realms/shop/.well-known/openid-configuration"
    assert issuer.label == "id.example.com/realms/shop"


def test_every_member_is_read(tmp_path):
    entry = {
        "issuer": "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_abc",
        "audience": "client-123",
        "algorithms": ["RS256", "PS256", "ES384", "EdDSA"],
        "leeway_seconds": 0,
        "scope_claim": "scp",
        "scope_prefix": "jetway/",
        "grants": ["read:catalog", "read:catalog"],
        "subject_claim": "username",
        "refresh_seconds": 300,
        "jwks_uri": "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_abc/.well-known/jwks.json",
        "max_jwks_bytes": 65536,
        "fetch_timeout_seconds": 2.5,
    }
    other = {"issuer": "http://127.0.0.1:8081/", "audience": "jetway"}
    first, second = load_issuers(written(tmp_path, {"issuers": [entry, other]}))
    assert first.algorithms == ("RS256", "PS256", "ES384", "EdDSA")
    assert first.grants == ("read:catalog",)
    assert (first.scope_claim, first.scope_prefix, first.subject_claim) == ("scp", "jetway/", "username")
    assert (first.leeway_seconds, first.refresh_seconds, first.max_jwks_bytes) == (0, 300, 65536)
    assert first.fetch_timeout_seconds == 2.5 and first.jwks_uri.endswith("/jwks.json")
    assert second.issuer == "http://127.0.0.1:8081/"
    assert second.discovery_uri == "http://127.0.0.1:8081/.well-known/openid-configuration"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000", "http://[::1]:9000/x", "http://localhost/realm"])
def test_plain_http_is_accepted_to_a_loopback_host_only(url):
    assert url_problem(url) is None
    assert "must use https" in url_problem(
        url.replace("127.0.0.1", "10.0.0.1").replace("[::1]", "example.com").replace("localhost", "id.example")
    )


@pytest.mark.parametrize(
    ("member", "value", "expected"),
    [
        ("issuer", "http://id.example.com", "member 'issuer' must use https"),
        ("issuer", "https://id.example.com/?tenant=1", "member 'issuer' must not have a query or fragment"),
        ("issuer", "https://user:pw@id.example.com", "must not carry a user or password"),
        ("issuer", "ftp://id.example.com", "must be an https:// URL with a host"),
        ("issuer", "https://id.example.com:99999", "is not a valid URL"),
        ("issuer", 42, "member 'issuer' must be a URL string, not 42"),
        ("issuer", None, "member 'issuer' is required"),
        ("audience", "", "member 'audience' must be a non-empty string"),
        ("audience", ["a", "b"], "member 'audience' must be a non-empty string"),
        ("audience", None, "member 'audience' is required"),
        ("algorithms", ["HS256"], "member 'algorithms' may not hold 'HS256': only asymmetric"),
        ("algorithms", ["RS256", "none"], "may not hold 'none'"),
        ("algorithms", ["RS256", "hs512"], "may not hold 'hs512'"),
        ("algorithms", ["RS257"], "holds unknown algorithm 'RS257'"),
        ("algorithms", [], "member 'algorithms' must be a non-empty list of algorithm names"),
        ("algorithms", "RS256", "member 'algorithms' must be a non-empty list"),
        ("algorithms", ["RS256", "RS256"], "names an algorithm twice"),
        ("leeway_seconds", 301, "member 'leeway_seconds' must be an integer from 0 to 300, not 301"),
        ("leeway_seconds", -1, "from 0 to 300, not -1"),
        ("leeway_seconds", 1.5, "from 0 to 300, not 1.5"),
        ("leeway_seconds", True, "from 0 to 300, not True"),
        ("scope_claim", "", "member 'scope_claim' must be a non-empty claim name"),
        ("scope_prefix", 7, "member 'scope_prefix' must be a string of at most 64 characters"),
        ("grants", ["read:Orders"], "member 'grants' holds 'read:Orders': each must be admin, read:<coll>"),
        ("grants", "admin", "member 'grants' must be a list of scopes"),
        ("subject_claim", "", "member 'subject_claim' must be a non-empty claim name"),
        ("refresh_seconds", 0, "member 'refresh_seconds' must be an integer from 1 to 86400, not 0"),
        ("jwks_uri", "http://keys.example.com/jwks", "member 'jwks_uri' must use https"),
        ("max_jwks_bytes", 100, "member 'max_jwks_bytes' must be an integer from 1024 to 16777216, not 100"),
        ("fetch_timeout_seconds", 0, "member 'fetch_timeout_seconds' must be a number of seconds from 0.1 to 60"),
        ("fetch_timeout_seconds", "5", "from 0.1 to 60, not '5'"),
        ("audiance", "jetway", "unknown member 'audiance' (known: issuer, audience, algorithms"),
    ],
)
def test_each_bad_member_is_named_with_what_it_must_be(tmp_path, member, value, expected):
    message = refusal(tmp_path, **{member: value})
    assert expected in message, message
    if member != "issuer":
        assert "(https://id.example.com/realms/shop)" in message  # which issuer, by its URL


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", "not valid JSON"),
        (b'{"issuers": [], }', "not valid JSON"),
        (
            b'{"issuers": [{"issuer": "https://a.example", "issuer": "https://b.example", "audience": "x"}]}',
            "not valid JSON",
        ),
        (b"[]", 'must be an object with one member, "issuers"'),
        (b'{"issuers": [], "extra": 1}', 'must be an object with one member, "issuers"'),
        (b'{"issuers": []}', '"issuers" must be a non-empty list'),
        (b'{"issuers": ["https://a.example"]}', "issuers[0]: must be an object"),
    ],
)
def test_a_file_that_is_not_an_issuers_document_says_so(tmp_path, raw, expected):
    path = written(tmp_path, None, raw)
    with pytest.raises(IssuerConfigError) as refused:
        load_issuers(path)
    assert str(refused.value).startswith(path + ": ") and expected in str(refused.value)


def test_an_issuer_named_twice_is_refused(tmp_path):
    path = written(tmp_path, {"issuers": [GOOD, {**GOOD, "audience": "other"}]})
    with pytest.raises(
        IssuerConfigError, match=r"issuers\[1\]: issuer 'https://id.example.com/realms/shop' is named twice"
    ):
        load_issuers(path)


def test_a_missing_or_huge_file_is_named(tmp_path):
    missing = str(tmp_path / "nowhere.json")
    with pytest.raises(IssuerConfigError, match=r"nowhere.json: cannot read the issuers file"):
        load_issuers(missing)
    huge = written(tmp_path, None, b" " * (1024 * 1024 + 1))
    with pytest.raises(IssuerConfigError, match=r"over 1048576 bytes"):
        load_issuers(huge)
