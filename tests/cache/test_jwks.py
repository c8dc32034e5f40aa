"""cache.credentials.jwks against a real provider (tests/cache/oidc_provider.py): what is fetched, when, what is kept.

The scenarios run in one subprocess with a real reactor for the network;
the refresh policy's time is a ``task.Clock`` each scenario advances, so
"one fetch per interval" is counted without waiting for an interval. The
JWKS parsing rules (which keys are kept) are checked in-process below.
"""

from __future__ import annotations

import re
from typing import Any, Dict

import pytest
from twisted.internet import task

from cache.credentials.issuers import Issuer
from cache.credentials.jwks import IssuerKeys, JwksError, jwks_uri_of, public_keys
from cache.credentials.jwt_tokens import JwtVerifier
from tests.cache.oidc_provider import (
    DISCOVERY,
    HUGE_BYTES,
    Provider,
    claims_for,
    ec_key,
    forged,
    mint,
    outcome,
    pause,
    public_jwks,
    rsa_key,
    run_scenarios,
    until,
)
from tests.cache.oidc_provider import figures as played

# The first test to ask for the scenarios waits for all of them (one subprocess: ~30 s here, more when busy).
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def scenarios() -> Dict[str, Any]:
    return run_scenarios(__name__)


# -- scenarios (played in the subprocess) ---------------------------------------------------------


async def scenario_discovery_then_jwks(reactor):
    key = rsa_key("k1")
    provider = await Provider.start(reactor, key)
    keys = IssuerKeys(provider.config(), reactor, clock=task.Clock())
    await keys.start()
    figures = {"kids": list(keys.kids), "discovery": provider.count(DISCOVERY), "jwks": provider.count("/jwks")}
    keys.stop()
    await provider.stop()
    return figures


async def scenario_configured_jwks_uri_skips_discovery(reactor):
    provider = await Provider.start(reactor, rsa_key("k1"))
    keys = IssuerKeys(provider.config(jwks_uri=provider.base + "/jwks"), reactor, clock=task.Clock())
    await keys.start()
    figures = {"kids": list(keys.kids), "discovery": provider.count(DISCOVERY)}
    keys.stop()
    await provider.stop()
    return figures


async def scenario_discovery_of_another_issuer(reactor):
    provider = await Provider.start(reactor, rsa_key("k1"))
    provider.discovery = {"issuer": "https://attacker.example/realm"}
    keys = IssuerKeys(provider.config(), reactor, clock=task.Clock())
    await keys.start()
    figures = {"fetched": keys.fetched, "error": keys.last_error, "jwks": provider.count("/jwks")}
    keys.stop()
    await provider.stop()
    return figures


async def scenario_discovery_names_a_plain_http_jwks_uri(reactor):
    provider = await Provider.start(reactor, rsa_key("k1"))
    provider.discovery = {"jwks_uri": "http://keys.example.com/jwks"}
    keys = IssuerKeys(provider.config(), reactor, clock=task.Clock())
    await keys.start()
    figures = {"fetched": keys.fetched, "error": keys.last_error}
    keys.stop()
    await provider.stop()
    return figures


async def scenario_redirect_is_not_followed(reactor):
    provider = await Provider.start(reactor, rsa_key("k1"))
    provider.behaviour["/jwks"] = "redirect"
    keys = IssuerKeys(provider.config(), reactor, clock=task.Clock())
    await keys.start()
    figures = {"fetched": keys.fetched, "error": keys.last_error, "moved": provider.count("/jwks-moved")}
    keys.stop()
    await provider.stop()
    return figures


async def scenario_silent_jwks_times_out(reactor):
    """A JWKS endpoint that accepts and never answers: the fetch ends at its deadline, the token is a 503."""
    key = rsa_key("k1")
    provider = await Provider.start(reactor, key)
    provider.behaviour["/jwks"] = "silent"
    # The JWKS's address given: a discovery slowed by a busy machine cannot spend the short deadline.
    issuer = provider.config(fetch_timeout_seconds=1.0, jwks_uri=provider.base + "/jwks")
    verifier = JwtVerifier([issuer], reactor, clock=task.Clock())
    started = reactor.seconds()
    await verifier.start()
    ended = reactor.seconds() - started
    keys = verifier.keys(provider.issuer)
    verdict = await outcome(verifier, mint(key, claims_for(provider.issuer)))
    figures = {"seconds": ended, "fetched": keys.fetched, "error": keys.last_error, "outcome": verdict}
    verifier.stop()
    await provider.stop()
    return figures


async def _huge(reactor, behaviour):
    provider = await Provider.start(reactor, rsa_key("k1"))
    provider.behaviour["/jwks"] = behaviour
    keys = IssuerKeys(provider.config(), reactor, clock=task.Clock())
    await keys.start()
    figures = {"fetched": keys.fetched, "error": keys.last_error, "requests": provider.count("/jwks")}
    keys.stop()
    await provider.stop()
    return figures


async def scenario_huge_jwks_is_aborted(reactor):
    return await _huge(reactor, "huge")


async def scenario_huge_declared_jwks_is_not_read(reactor):
    return await _huge(reactor, "huge-declared")


async def scenario_down_issuer_keeps_known_keys(reactor):
    """Fetched once, then connection refused: known keys still verify; an unknown kid is a 401 (refused)."""
    key = rsa_key("k1")
    provider = await Provider.start(reactor, key)
    clock = task.Clock()
    verifier = JwtVerifier([provider.config()], reactor, clock=clock)
    await verifier.start()
    keys = verifier.keys(provider.issuer)
    await provider.stop()
    clock.advance(provider.config().refresh_seconds)  # the periodic refresh: refused
    await keys.settled()
    figures = {
        "healthy": keys.healthy,
        "error": keys.last_error,
        "known": await outcome(verifier, mint(key, claims_for(provider.issuer, sub="bob"))),
        "unknown": await outcome(verifier, mint(rsa_key("k2"), claims_for(provider.issuer))),
    }
    verifier.stop()
    return figures


async def scenario_never_fetched_is_unavailable(reactor):
    key = rsa_key("k1")
    provider = await Provider.start(reactor, key)
    await provider.stop()  # its port is closed before the first fetch
    verifier = JwtVerifier([provider.config()], reactor, clock=task.Clock())
    await verifier.start()
    keys = verifier.keys(provider.issuer)
    token = mint(key, claims_for(provider.issuer))
    figures = {
        "fetched": keys.fetched,
        "first": await outcome(verifier, token),  # may fetch once more for it (the kid budget): refused too
        "fetches_after_first": keys.fetches,
        "second": await outcome(verifier, token),  # no fetch may start: at once
        "fetches_after_second": keys.fetches,
    }
    verifier.stop()
    return figures


async def scenario_flood_of_unknown_kids(reactor):
    """2,000 tokens naming unknown kids within one interval, then more after each of two intervals."""
    key = rsa_key("k1")
    provider = await Provider.start(reactor, key)
    clock = task.Clock()
    # 1,000 cold verifications take seconds on a loaded machine, while the shared fetch is in flight.
    issuer = provider.config(refresh_seconds=60, fetch_timeout_seconds=60.0)
    verifier = JwtVerifier([issuer], reactor, clock=clock)
    await verifier.start()
    keys = verifier.keys(provider.issuer)
    claims = claims_for(provider.issuer)

    async def flood(start):
        tokens = [forged({"alg": "RS256", "kid": f"unknown-{start + n}"}, claims) for n in range(1000)]
        verdicts = await _all([outcome(verifier, token) for token in tokens])
        return sorted(set(verdict.split(" ")[0] for verdict in verdicts))

    start_fetches = provider.count("/jwks")
    first = await flood(0)  # the first starts a fetch; the other 999 wait for that one
    in_flight_shared = provider.count("/jwks") - start_fetches
    second = await flood(1000)  # the kid budget of this interval is spent: refused at once
    within_first_interval = provider.count("/jwks") - start_fetches
    per_interval = []
    for interval in range(2):
        before = provider.count("/jwks")
        clock.advance(60)  # the periodic refresh is due, and the kid budget comes back
        await keys.settled()
        await flood(2000 + 1000 * interval)
        await keys.settled()
        per_interval.append(provider.count("/jwks") - before)
    figures = {
        "first": first,
        "second": second,
        "in_flight_shared": in_flight_shared,
        "within_first_interval": within_first_interval,
        "per_interval": per_interval,
        "known_still": await outcome(verifier, mint(key, claims)),
        "last_error": keys.last_error,
    }
    verifier.stop()
    await provider.stop()
    return figures


async def scenario_new_key_is_fetched_for_its_first_token(reactor):
    old, new = rsa_key("old"), ec_key("new")
    provider = await Provider.start(reactor, old)
    verifier = JwtVerifier([provider.config()], reactor, clock=task.Clock())
    await verifier.start()
    provider.jwks = public_jwks(old, new)  # the provider rotates in a key
    token = mint(new, claims_for(provider.issuer))
    pending = verifier.verify(token)
    figures = {
        "waited": not isinstance(pending, Exception) and hasattr(pending, "addCallback"),
        "outcome": await outcome(verifier, token),
        "jwks": provider.count("/jwks"),
    }
    verifier.stop()
    await provider.stop()
    return figures


async def scenario_removed_key_stops_at_next_refresh(reactor):
    kept, removed = rsa_key("kept"), rsa_key("removed")
    provider = await Provider.start(reactor, kept, removed)
    clock = task.Clock()
    verifier = JwtVerifier([provider.config(refresh_seconds=60)], reactor, clock=clock)
    await verifier.start()
    keys = verifier.keys(provider.issuer)
    cached = mint(removed, claims_for(provider.issuer))
    before = await outcome(verifier, cached)
    provider.jwks = public_jwks(kept)
    still_before_refresh = await outcome(verifier, cached)
    clock.advance(60)
    await keys.settled()
    figures = {
        "before": before,
        "before_refresh": still_before_refresh,
        "cached_after": await outcome(verifier, cached),
        "fresh_after": await outcome(verifier, mint(removed, claims_for(provider.issuer, sub="bob"))),
        "kept_after": await outcome(verifier, mint(kept, claims_for(provider.issuer))),
        "kids": list(keys.kids),
    }
    verifier.stop()
    await provider.stop()
    return figures


async def scenario_periodic_refresh_without_traffic(reactor):
    provider = await Provider.start(reactor, rsa_key("k1"))
    clock = task.Clock()
    keys = IssuerKeys(provider.config(refresh_seconds=30), reactor, clock=clock)
    await keys.start()
    counts = [provider.count("/jwks")]
    for _ in range(3):
        clock.advance(29)
        await pause(reactor, 0.05)
        counts.append(provider.count("/jwks"))
        clock.advance(1)
        await keys.settled()
        await until(reactor, lambda: not keys.fetching, "the periodic fetch")
        counts.append(provider.count("/jwks"))
    keys.stop()
    clock.advance(3600)
    await pause(reactor, 0.05)
    counts.append(provider.count("/jwks"))
    await provider.stop()
    return {"counts": counts}


async def _all(waits):
    from twisted.internet import defer

    return await defer.gatherResults([defer.ensureDeferred(wait) for wait in waits])


# -- the tests ------------------------------------------------------------------------------------


def test_keys_come_from_the_discovery_documents_jwks_uri(scenarios):
    figures = played(scenarios, "discovery_then_jwks")
    assert figures == {"kids": ["k1"], "discovery": 1, "jwks": 1}


def test_a_configured_jwks_uri_needs_no_discovery(scenarios):
    figures = played(scenarios, "configured_jwks_uri_skips_discovery")
    assert figures == {"kids": ["k1"], "discovery": 0}


def test_a_discovery_document_naming_another_issuer_is_refused(scenarios):
    figures = played(scenarios, "discovery_of_another_issuer")
    assert figures["fetched"] is False and figures["jwks"] == 0
    assert "names issuer 'https://attacker.example/realm'" in figures["error"]


def test_a_discovered_jwks_uri_over_plain_http_to_another_host_is_refused(scenarios):
    figures = played(scenarios, "discovery_names_a_plain_http_jwks_uri")
    assert figures["fetched"] is False
    assert "must use https" in figures["error"]


def test_a_redirect_is_not_followed(scenarios):
    figures = played(scenarios, "redirect_is_not_followed")
    assert figures["fetched"] is False and figures["moved"] == 0
    assert "HTTP 302" in figures["error"]


def test_a_jwks_endpoint_that_never_answers_is_given_up_at_the_deadline(scenarios):
    figures = played(scenarios, "silent_jwks_times_out")
    assert figures["fetched"] is False
    assert figures["error"].endswith("/jwks: no whole answer within 1 s")
    assert figures["outcome"] == "unavailable"


@pytest.mark.parametrize("name", ["huge_jwks_is_aborted", "huge_declared_jwks_is_not_read"])
def test_a_10_mb_jwks_is_cut_off_at_the_bound(scenarios, name):
    figures = played(scenarios, name)
    assert figures["fetched"] is False and figures["requests"] == 1
    bound = Issuer("https://x.example", "a").max_jwks_bytes
    if name == "huge_declared_jwks_is_not_read":  # its Content-Length says so: nothing is read
        assert f"sends {HUGE_BYTES} bytes, over the bound of {bound}" in figures["error"]
    else:  # read as it comes: stopped within one read (64 KiB) past the bound
        stopped_at = int(re.search(r"more than \d+ bytes \(stopped at (\d+)\)", figures["error"]).group(1))
        assert bound < stopped_at <= bound + 64 * 1024


def test_known_keys_still_verify_while_the_issuer_is_down(scenarios):
    figures = played(scenarios, "down_issuer_keeps_known_keys")
    assert figures["healthy"] is False and "Connection" in figures["error"]
    assert figures["known"].startswith("ok:oidc:127.0.0.1")
    # Issue #58: "others get 401 (or 503 if no key was ever fetched)": keys were fetched once, so a 401.
    assert figures["unknown"].startswith("refused:no key")


def test_an_issuer_never_fetched_is_unavailable_and_its_tokens_do_not_start_fetches(scenarios):
    figures = played(scenarios, "never_fetched_is_unavailable")
    assert figures["fetched"] is False
    assert figures["first"] == figures["second"] == "unavailable"
    assert figures["fetches_after_first"] == 2  # start, and the kid budget of this interval
    assert figures["fetches_after_second"] == 2


def test_a_flood_of_unknown_kids_costs_at_most_one_fetch_per_interval_of_its_own(scenarios):
    figures = played(scenarios, "flood_of_unknown_kids")
    assert figures["first"] == figures["second"] == ["refused:no"]  # "no key ... in the JWKS"
    assert figures["in_flight_shared"] == 1
    assert figures["within_first_interval"] == 1
    assert figures["per_interval"] == [2, 2]  # the periodic refresh, and one for the flood
    assert figures["known_still"].startswith("ok:")


def test_a_key_rotated_in_is_fetched_for_its_first_token(scenarios):
    figures = played(scenarios, "new_key_is_fetched_for_its_first_token")
    assert figures["waited"] is True
    assert figures["outcome"].startswith("ok:")
    assert figures["jwks"] == 2


def test_a_key_removed_from_the_jwks_stops_its_tokens_at_the_next_refresh(scenarios):
    figures = played(scenarios, "removed_key_stops_at_next_refresh")
    assert figures["before"].startswith("ok:") and figures["before_refresh"].startswith("ok:")
    assert figures["cached_after"].startswith("refused:its key 'removed' left the JWKS")
    assert figures["fresh_after"].startswith("refused:no key 'removed'")
    assert figures["kept_after"].startswith("ok:")
    assert figures["kids"] == ["kept"]


def test_the_jwks_is_fetched_every_refresh_seconds_without_traffic_and_not_after_stop(scenarios):
    figures = played(scenarios, "periodic_refresh_without_traffic")
    assert figures["counts"] == [1, 1, 2, 2, 3, 3, 4, 4]


# -- which keys are kept (in-process) -------------------------------------------------------------


def jwk(key, **changes):
    entry = key.as_dict(private=False)
    entry.update(changes)
    return {name: value for name, value in entry.items() if value is not None}


@pytest.mark.filterwarnings("ignore::joserfc.errors.SecurityWarning")  # joserfc's warning as it makes the 1024-bit key
def test_only_usable_public_keys_are_kept_and_each_dropped_one_says_why():
    rsa, ec = rsa_key("rsa"), ec_key("ec")
    document = {
        "keys": [
            jwk(rsa),
            jwk(ec),
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            rsa_key("private").as_dict(private=True),
            jwk(rsa_key("enc"), use="enc"),
            jwk(rsa_key("ops"), key_ops=["encrypt"]),
            jwk(rsa_key("other-alg"), alg="RS512"),
            jwk(rsa_key("nokid"), kid=None),
            jwk(ec_key("p384", "P-384")),  # kept: ES256 and ES384 share the key type; the curve is checked per token
            jwk(rsa_key("small", 1024)),
            {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
            "not a key",
        ]
    }
    kept, dropped = public_keys(document, ("RS256", "ES256"))
    assert sorted(kept) == ["ec", "p384", "rsa"]
    reasons = "\n".join(dropped)
    for expected in (
        "'hmac': a symmetric (oct) key is never used",
        "'private': it carries private key members",
        "'enc': its use is not sig",
        "'ops': its key_ops do not include verify",
        "'other-alg': its alg 'RS512' is not allowed",
        "a key without a kid: no kid",
        "'small': an RSA key under 2048 bits",
        "'broken': cannot be read",
        "a key without a kid: not an object",
    ):
        assert expected in reasons


def test_key_types_no_allowed_algorithm_uses_and_a_kid_named_twice_are_dropped():
    rsa, twin = rsa_key("twin"), ec_key("twin")
    kept, dropped = public_keys(public_jwks(rsa, twin, ec_key("ec")), ("ES256",))
    assert list(kept) == ["twin", "ec"]  # the RSA "twin" is not usable here, so the EC one is unambiguous
    assert kept["twin"][1].key_type == "EC"
    assert any("no allowed algorithm (ES256) uses key type 'RSA'" in reason for reason in dropped)
    kept, dropped = public_keys(public_jwks(rsa_key("a"), rsa_key("a")), ("RS256",))
    assert kept == {} and "key 'a': its kid is named twice" in dropped


@pytest.mark.parametrize("kty", [[], {}, ["RSA"], 1, None, True])
def test_a_key_whose_members_are_of_another_json_type_is_dropped_and_the_others_kept(kty):
    # A list or object kty once raised inside the set lookup, and so refused every key of the set.
    rsa = rsa_key("rsa")
    odd = {"kty": kty, "kid": "odd", "alg": ["RS256"], "crv": {}, "use": [], "n": "AQAB", "e": "AQAB"}
    kept, dropped = public_keys({"keys": [odd, jwk(rsa)]}, ("RS256", "EdDSA"))
    assert list(kept) == ["rsa"]
    assert len(dropped) == 1 and dropped[0].startswith("key 'odd': ")


@pytest.mark.parametrize("document", [[], {"keys": {}}, {"nokeys": []}, {"keys": [{}] * 101}])
def test_a_document_that_is_not_a_small_jwk_set_is_refused_whole(document):
    with pytest.raises(JwksError):
        public_keys(document, ("RS256",))


def test_an_unchanged_key_keeps_its_object_across_fetches_and_a_changed_one_does_not():
    a, b = rsa_key("a"), rsa_key("b")
    keys = IssuerKeys(Issuer("https://id.example", "jetway"), task.Clock(), fetch=lambda *_: None)
    keys.load(public_jwks(a, b))
    first_a, first_b = keys.key("a"), keys.key("b")
    keys.load({"keys": [jwk(a), jwk(rsa_key("b"))]})  # b's kid, another key
    assert keys.key("a") is first_a
    assert keys.key("b") is not first_b and keys.key("b") is not None


def test_discovery_must_name_the_configured_issuer_exactly():
    issuer = Issuer("https://id.example/realm", "jetway")
    good = b'{"issuer": "https://id.example/realm", "jwks_uri": "https://id.example/keys"}'
    assert jwks_uri_of(good, issuer) == "https://id.example/keys"
    for body in (
        b'{"issuer": "https://id.example/realm/", "jwks_uri": "https://id.example/keys"}',
        b'{"issuer": "https://id.example/realm"}',
        b'{"issuer": "https://id.example/realm", "jwks_uri": "ftp://id.example/keys"}',
        b'{"issuer": "https://id.example/realm", "issuer": "https://id.example/realm", "jwks_uri": "https://a/k"}',
        b"[]",
    ):
        with pytest.raises(JwksError):
            jwks_uri_of(body, issuer)
