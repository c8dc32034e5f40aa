"""cache.credentials.jwt_tokens: each attack on a bearer JWT refused, good tokens mapped to records, the claims cache.

Most cases run in-process: the verifier's keys come from a JWKS served by
a fetch that answers at once from a dict (its URLs counted), and time is a
value the test sets. The headers that name a key's address (``jku``,
``x5u``) are also played against a real provider in a reactor
(tests/cache/oidc_provider.py), which counts that nothing asked it for them.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
from joserfc import jws
from twisted.internet import defer, task
from twisted.python.failure import Failure

from cache.credentials.identity import Identity
from cache.credentials.issuers import Issuer
from cache.credentials.jwt_tokens import (
    IssuerUnavailable,
    JwtRefused,
    JwtVerifier,
    grants_of,
    looks_like_jwt,
    warm_up,
)
from cache.credentials.tickets import record_of, snapshot_of
from cache.credentials.tokens import TokenRecord, digest_of
from cache.credentials.watch import CredentialWatch
from tests.cache.oidc_provider import (
    AUDIENCE,
    Provider,
    claims_for,
    ec_key,
    ed_key,
    forged,
    hmac_signed,
    mint,
    outcome,
    pause,
    public_jwks,
    rsa_key,
    run_scenarios,
)
from tests.cache.oidc_provider import figures as played
from tests.cache.test_credential_watch import Tokens as WatchTokens

ISSUER = "https://id.example.com/realm"
OTHER = "https://other.example.com"
NOW = 1_800_000_000


@pytest.fixture(scope="module")
def keys() -> Dict[str, Any]:
    return {
        "rsa": rsa_key("rsa-1"),
        "ec": ec_key("ec-1"),
        "ed": ed_key("ed-1"),
        "other": rsa_key("other-1"),  # the other issuer's
        "attacker": rsa_key("attacker"),
        "attacker-ec": ec_key("attacker-ec"),  # small enough to ride in a header (an RSA JWK passes 512 bytes)
    }


class Setup:
    """A verifier of two issuers, keys served from ``self.jwks`` by URL, time at ``self.now``."""

    def __init__(self, keys: Dict[str, Any], max_cached: int = 100, **changes: Any) -> None:
        self.keys = keys
        self.now = float(NOW)
        self.fetched: List[str] = []
        self.jwks = {
            ISSUER + "/jwks": public_jwks(keys["rsa"], keys["ec"], keys["ed"]),
            OTHER + "/jwks": public_jwks(keys["other"]),
        }
        settings = {"algorithms": ("RS256", "ES256", "PS256", "EdDSA"), **changes}
        self.issuer = Issuer(ISSUER, AUDIENCE, jwks_uri=ISSUER + "/jwks", **settings)
        other = Issuer(OTHER, AUDIENCE, jwks_uri=OTHER + "/jwks")
        self.clock = task.Clock()
        self.verifier = JwtVerifier(
            [self.issuer, other], self.clock, now=lambda: self.now, fetch=self._fetch, max_cached=max_cached
        )
        self.verifier.start()

    def _fetch(self, url: str, max_bytes: int, timeout: float) -> defer.Deferred:
        self.fetched.append(url)
        return defer.succeed(json.dumps(self.jwks[url]).encode())

    def claims(self, **changes: Any) -> Dict[str, Any]:
        return claims_for(ISSUER, **{"iat": NOW - 5, "exp": NOW + 600, **changes})

    def verify(self, token: str) -> Any:
        """The record, or raises the refusal (a fired Deferred's too)."""
        result = self.verifier.verify(token)
        if isinstance(result, defer.Deferred):
            settled: List[Any] = []
            result.addBoth(settled.append)
            assert settled, "the verification is still waiting"
            if isinstance(settled[0], Failure):
                settled[0].raiseException()
            return settled[0]
        return result

    def refusal(self, token: str) -> str:
        with pytest.raises(JwtRefused) as refused:
            self.verify(token)
        return refused.value.reason


@pytest.fixture
def setup(keys) -> Setup:
    return Setup(keys)


# -- good tokens ----------------------------------------------------------------------------------


def test_a_good_token_becomes_a_token_record_with_its_identity(setup):
    token = mint(setup.keys["rsa"], setup.claims(scope="read:orders write:orders openid"))
    record = setup.verify(token)
    assert isinstance(record, TokenRecord) and record.identity is not None
    assert record.digest == digest_of(token)
    assert record.name == "oidc:id.example.com/realm:alice"
    assert record.scopes == ("read:orders", "write:orders")
    assert (record.rate, record.rate_limit(), record.created) == ("", None, NOW - 5)
    assert record.expires == NOW + 600 + 30  # exp and the leeway: when the Gate's record.expired() turns
    assert not record.expired(NOW + 629) and record.expired(NOW + 630)
    assert record.identity == Identity(ISSUER, "alice", "rsa-1", NOW + 600, record.identity.claims)
    assert record.identity.claims["scope"] == "read:orders write:orders openid"
    with pytest.raises(TypeError):
        record.identity.claims["sub"] = "mallory"  # read-only


@pytest.mark.parametrize(("key", "alg"), [("rsa", "RS256"), ("rsa", "PS256"), ("ec", "ES256"), ("ed", "EdDSA")])
def test_each_allowed_algorithm_verifies_with_its_key(setup, key, alg):
    assert setup.verify(mint(setup.keys[key], setup.claims(), alg)).name.endswith(":alice")


@pytest.mark.parametrize("typ", ["JWT", "jwt", "at+jwt", "AT+JWT", "application/at+jwt"])
def test_an_access_token_type_or_plain_jwt_is_accepted(setup, typ):
    assert setup.verify(mint(setup.keys["rsa"], setup.claims(), typ=typ))


def test_an_audience_list_holding_ours_is_accepted(setup):
    assert setup.verify(mint(setup.keys["rsa"], setup.claims(aud=["account", AUDIENCE])))


@pytest.mark.parametrize(("claim", "offset"), [("exp", -29), ("nbf", 29), ("iat", 29)])
def test_times_within_the_leeway_are_accepted(setup, claim, offset):
    assert setup.verify(mint(setup.keys["rsa"], setup.claims(**{claim: NOW + offset})))


# -- refused: the signature and the key -----------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_is_refused(setup, alg):
    unsigned = forged({"alg": alg, "typ": "JWT", "kid": "rsa-1"}, setup.claims(), signature=b"")
    assert setup.refusal(unsigned) == "not a JWT (three base64url segments)"
    with_a_signature = forged({"alg": alg, "typ": "JWT", "kid": "rsa-1"}, setup.claims())
    assert setup.refusal(with_a_signature) == f"algorithm '{alg}' is not allowed for {ISSUER}"
    assert setup.verifier.signature_checks == 0


@pytest.mark.parametrize("form", ["pem", "jwk"])
def test_hs256_signed_with_the_issuers_public_key_is_refused(setup, form):
    public = setup.keys["rsa"]
    secret = public.as_pem(private=False) if form == "pem" else json.dumps(public.as_dict(private=False)).encode()
    token = hmac_signed({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, setup.claims(), secret)
    assert setup.refusal(token) == f"algorithm 'HS256' is not allowed for {ISSUER}"
    assert setup.verifier.signature_checks == 0


def test_an_algorithm_outside_the_allow_list_is_refused_even_signed_by_the_real_key(setup):
    token = mint(setup.keys["rsa"], setup.claims(), "RS512")
    assert setup.refusal(token) == f"algorithm 'RS512' is not allowed for {ISSUER}"


def test_a_kid_naming_a_path_is_just_an_unknown_key(setup):
    token = mint(setup.keys["attacker"], setup.claims(), kid="../../etc/passwd")
    assert setup.refusal(token) == f"no key '../../etc/passwd' in the JWKS of {ISSUER}"
    assert setup.fetched == [ISSUER + "/jwks", OTHER + "/jwks", ISSUER + "/jwks"]  # one fetch for it, of its issuer


def test_a_kid_naming_another_issuers_key_is_unknown(setup):
    token = mint(setup.keys["other"], setup.claims())  # iss ours, kid and signature the other issuer's
    assert setup.refusal(token) == f"no key 'other-1' in the JWKS of {ISSUER}"


def test_a_signature_by_another_key_under_a_known_kid_is_refused(setup):
    assert setup.refusal(mint(setup.keys["attacker"], setup.claims(), kid="rsa-1")) == "bad signature"


def test_claims_changed_after_signing_are_refused(setup):
    header, _, signature = mint(setup.keys["rsa"], setup.claims()).split(".")
    changed = forged({}, setup.claims(scope="admin")).split(".")[1]
    assert setup.refusal(f"{header}.{changed}.{signature}") == "bad signature"


def test_a_key_of_another_type_than_the_algorithm_is_refused(setup):
    token = forged({"alg": "ES256", "kid": "rsa-1"}, setup.claims(), signature=b"x" * 64)
    assert setup.refusal(token).startswith("key 'rsa-1' cannot check this token")


def test_a_token_naming_no_key_is_refused(setup):
    for header in ({"alg": "RS256"}, {"alg": "RS256", "kid": ""}, {"alg": "RS256", "kid": 7}):
        assert setup.refusal(forged(header, setup.claims())) == "the token names no key (kid)"


@pytest.mark.parametrize("header", ["jku", "x5u", "jwk", "x5c"])
def test_a_token_offering_a_key_or_its_address_is_refused_outright(setup, header):
    attacker = setup.keys["attacker"]
    offered = {
        "jku": "https://attacker.example/jwks",
        "x5u": "https://attacker.example/cert.pem",
        "jwk": setup.keys["attacker-ec"].as_dict(private=False),
        "x5c": ["MIIBszCCAVmgAwIBAgIUQ=="],
    }[header]
    own = setup.keys["attacker-ec"] if header == "jwk" else attacker
    for key in (own, setup.keys["rsa"]):  # the attacker's key, and even the issuer's real one
        token = mint(key, setup.claims(), **{header: offered})
        assert setup.refusal(token).startswith(f"header '{header}' is refused")
    assert setup.fetched == [ISSUER + "/jwks", OTHER + "/jwks"]  # nothing fetched for it
    assert setup.verifier.signature_checks == 0


@pytest.mark.parametrize(("header", "value"), [("crit", ["exp"]), ("b64", False)])
def test_critical_extensions_and_unencoded_payloads_are_refused(setup, header, value):
    token = forged({"alg": "RS256", "kid": "rsa-1", header: value}, setup.claims())
    reason = setup.refusal(token)
    # b64 without crit is refused by joserfc as it reads the token (RFC 7797 requires it in crit)
    assert reason.startswith(f"header '{header}' is refused") or f"critical '{header}'" in reason


# -- refused: the claims --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"exp": NOW - 31}, "expired"),
        ({"exp": NOW - 30}, "expired"),
        ({"nbf": NOW + 31}, "not valid yet (nbf)"),
        ({"iat": NOW + 31}, "issued in the future (iat)"),
        ({"aud": "another-api"}, "not for audience 'jetway'"),
        ({"aud": ["another-api", "account"]}, "not for audience 'jetway'"),
        ({"aud": None}, "not for audience 'jetway'"),
        ({"exp": None}, "no exp"),
        ({"exp": str(NOW + 600)}, "exp is not a number of seconds"),
        ({"exp": True}, "exp is not a number of seconds"),
        ({"nbf": "soon"}, "nbf is not a number of seconds"),
        ({"sub": None}, "no sub (the subject) in the token"),
        ({"sub": ""}, "no sub (the subject) in the token"),
        ({"sub": 42}, "no sub (the subject) in the token"),
    ],
)
def test_claims_that_do_not_hold_are_refused(setup, changes, reason):
    assert setup.refusal(mint(setup.keys["rsa"], setup.claims(**changes))) == reason


@pytest.mark.parametrize(
    ("iss", "reason"),
    [
        (ISSUER + "/", f"issuer '{ISSUER}/' is not configured"),  # wrong iss: one character off
        ("https://attacker.example", "issuer 'https://attacker.example' is not configured"),  # unconfigured
        (None, "issuer 'None' is not configured"),
        ([ISSUER], f"issuer \"['{ISSUER}']\" is not configured"),
    ],
)
def test_a_token_of_an_issuer_not_configured_is_refused(setup, iss, reason):
    assert setup.refusal(mint(setup.keys["rsa"], setup.claims(iss=iss))) == reason


@pytest.mark.parametrize("typ", ["JWE", "dpop+jwt", "logout+jwt", 7])
def test_a_token_of_another_type_is_refused(setup, typ):
    token = forged({"alg": "RS256", "kid": "rsa-1", "typ": typ}, setup.claims())
    assert setup.refusal(token).startswith("typ ")


@pytest.mark.parametrize(
    "payload",
    [
        b'{"sub": "alice", "sub": "admin"}',  # I-JSON: a repeated name
        b'{"exp": NaN}',
        b"[1, 2]",
        b"\xff\xfe",
    ],
)
def test_claims_that_are_not_strict_json_objects_are_refused_even_when_signed(setup, payload):
    key = setup.keys["rsa"]
    token = jws.serialize_compact({"alg": "RS256", "kid": "rsa-1"}, payload, key, algorithms=["RS256"])
    assert "claims are not" in setup.refusal(token)


@pytest.mark.parametrize(
    "token",
    [
        "jw_" + "a" * 43,
        "eyJhbGciOiJSUzI1NiJ9.e30",
        "eyJhbGciOiJSUzI1NiJ9.e30.c2ln.extra.parts",
        "eyJhbGciOiJSUzI1NiJ9.e30.c2ln=",
        "eyJhbGciOiJSUzI1NiJ9.e30.",
        "eyJub3QganNvbg.e30.c2ln",
    ],
)
def test_what_is_not_a_jws_in_three_segments_is_refused(setup, token):
    reason = setup.refusal(token)
    assert reason.startswith(("not a JWT", "malformed"))


def test_a_payload_over_8000_bytes_is_refused_before_its_signature_is_checked(setup):
    token = mint(setup.keys["rsa"], setup.claims(padding="x" * 6000))
    assert setup.refusal(token).startswith("malformed (exceeded_size")
    assert setup.verifier.signature_checks == 0


def test_looks_like_jwt_tells_jwts_from_jetways_own_tokens(keys):
    assert looks_like_jwt(mint(keys["rsa"], claims_for(ISSUER)))
    assert not looks_like_jwt("jw_" + "A" * 43)
    assert not looks_like_jwt("eyJ.only-two")


# -- keys not there -------------------------------------------------------------------------------


def test_an_issuer_whose_keys_were_never_fetched_is_unavailable(keys):
    issuer = Issuer(ISSUER, AUDIENCE, jwks_uri=ISSUER + "/jwks", refresh_seconds=120)
    attempts: List[str] = []

    def down(url: str, max_bytes: int, timeout: float) -> defer.Deferred:
        attempts.append(url)
        return defer.fail(ConnectionRefusedError("connection refused"))

    verifier = JwtVerifier([issuer], task.Clock(), now=lambda: NOW, fetch=down)
    verifier.start()
    token = mint(keys["rsa"], claims_for(ISSUER, iat=NOW, exp=NOW + 600))
    first = verifier.verify(token)  # the kid budget allows one more fetch: failed too
    failures: List[Failure] = []
    first.addErrback(failures.append)
    assert failures[0].check(IssuerUnavailable)
    with pytest.raises(IssuerUnavailable) as unavailable:
        verifier.verify(token)  # no fetch may start now: at once
    assert unavailable.value.issuer == ISSUER and unavailable.value.retry_after == 120
    assert "connection refused" in str(unavailable.value)
    assert len(attempts) == 2


# -- the claims cache -----------------------------------------------------------------------------


def test_a_repeated_token_pays_no_signature_check(setup):
    token = mint(setup.keys["rsa"], setup.claims())
    first = setup.verify(token)
    second = setup.verify(token)
    assert second is first
    assert setup.verifier.verify(token, digest_of(token)) is first  # the Gate's digest, not hashed again
    assert setup.verifier.signature_checks == 1


def test_a_cached_token_that_expired_is_refused_and_dropped(setup):
    token = mint(setup.keys["rsa"], setup.claims(exp=NOW + 60))
    setup.verify(token)
    setup.now = NOW + 89
    assert setup.verify(token)
    setup.now = NOW + 90  # exp and the 30 s leeway
    assert setup.refusal(token) == "expired"
    setup.now = NOW
    assert setup.verify(token)  # dropped, so judged afresh (here valid again): a signature check
    assert setup.verifier.signature_checks == 2


def test_a_cached_token_whose_key_left_the_jwks_is_refused(setup):
    token = mint(setup.keys["ec"], setup.claims())
    setup.verify(token)
    setup.jwks[ISSUER + "/jwks"] = public_jwks(setup.keys["rsa"])
    setup.clock.advance(setup.issuer.refresh_seconds)  # the periodic fetch
    assert setup.refusal(token) == f"its key 'ec-1' left the JWKS of {ISSUER}"


def test_a_cached_token_survives_a_refresh_that_keeps_its_key(setup):
    token = mint(setup.keys["ec"], setup.claims())
    setup.verify(token)
    setup.clock.advance(setup.issuer.refresh_seconds)
    assert setup.verify(token) and setup.verifier.signature_checks == 1


def test_an_open_stream_of_a_token_whose_key_left_the_jwks_ends_at_the_refresh_and_no_other(setup):
    watch = CredentialWatch(WatchTokens(setup.clock), lambda: setup.now, setup.verifier)  # type: ignore[arg-type]
    ended: List[str] = []
    for name, key in (("ec", setup.keys["ec"]), ("rsa", setup.keys["rsa"])):
        record = setup.verify(mint(key, setup.claims(sub=name)))
        watch.hold(record, lambda why, name=name: ended.append(f"{name} {why}"))
    snapshot = setup.verify(mint(setup.keys["ec"], setup.claims(sub="ticket")))  # a ticket's: kid, no key
    ticketed = record_of(snapshot_of(snapshot), snapshot.digest)
    watch.hold(ticketed, lambda why: ended.append(f"ticket {why}"))
    setup.clock.advance(setup.issuer.refresh_seconds)  # a refresh that keeps every key
    assert ended == []
    setup.jwks[ISSUER + "/jwks"] = public_jwks(setup.keys["rsa"])
    setup.clock.advance(setup.issuer.refresh_seconds)  # the next: ec-1 withdrawn
    assert sorted(ended) == ["ec token-revoked", "ticket token-revoked"]
    setup.clock.advance(setup.issuer.refresh_seconds)
    assert len(ended) == 2  # ended once


def test_the_claims_cache_is_bounded_in_entries(keys):
    setup = Setup(keys, max_cached=2)
    tokens = [mint(keys["rsa"], setup.claims(sub=name)) for name in ("a", "b", "c")]
    for token in tokens:
        setup.verify(token)
    setup.verify(tokens[2])
    assert setup.verifier.signature_checks == 3
    setup.verify(tokens[0])  # pushed out by the third
    assert setup.verifier.signature_checks == 4


# -- grants ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claims", "settings", "expected"),
    [
        ({"scope": "read:orders write:* openid profile"}, {}, ("read:orders", "write:*")),
        ({"scope": ["admin", "read:x", 7, "read:BAD"]}, {}, ("admin", "read:x")),
        ({"scp": "read:a"}, {"scope_claim": "scp"}, ("read:a",)),
        ({"scope": "jetway/read:a admin jetway/write:b"}, {"scope_prefix": "jetway/"}, ("read:a", "write:b")),
        ({}, {"grants": ("read:catalog",)}, ("read:catalog",)),
        ({"scope": "read:a read:catalog"}, {"grants": ("read:catalog",)}, ("read:a", "read:catalog")),
        ({"scope": {"read": "a"}}, {}, ()),
        ({}, {}, ()),
    ],
)
def test_grants_are_the_scope_claims_jetway_scopes_and_the_fixed_ones(claims, settings, expected):
    assert grants_of(claims, Issuer(ISSUER, AUDIENCE, **settings)) == expected


def test_the_warm_up_verifies_without_the_network():
    assert warm_up(4) > 0


# -- against a real provider: key addresses in a token are never fetched --------------------------


async def scenario_key_addresses_in_headers_are_never_fetched(reactor):
    key, attacker = rsa_key("k1"), ec_key("attacker")
    provider = await Provider.start(reactor, key)
    provider.jwks = public_jwks(key)
    verifier = JwtVerifier([provider.config()], reactor, clock=task.Clock())
    await verifier.start()
    before = dict(provider.requests)
    served = provider.base + "/jwks"  # a real JWKS, the attacker's pick
    verdicts = {}
    for header, value in (
        ("jku", served),
        ("x5u", provider.base + "/cert.pem"),
        ("jwk", attacker.as_dict(private=False)),
        ("x5c", ["MIIBszCCAVmgAwIBAgIUQ=="]),
    ):
        verdicts[header] = await outcome(verifier, mint(attacker, claims_for(provider.issuer), **{header: value}))
    await pause(reactor, 0.5)  # anything started would have been asked by now
    figures = {"verdicts": verdicts, "before": before, "after": dict(provider.requests)}
    verifier.stop()
    await provider.stop()
    return figures


@pytest.fixture(scope="module")
def scenarios() -> Dict[str, Any]:
    return run_scenarios(__name__)


@pytest.mark.timeout(600)  # it waits for the scenario's subprocess (a PyPy start, a provider, a verifier)
def test_jku_x5u_jwk_and_x5c_pointing_at_a_live_server_make_no_request(scenarios):
    figures = played(scenarios, "key_addresses_in_headers_are_never_fetched")
    assert {header: verdict.split(" is ")[0] for header, verdict in figures["verdicts"].items()} == {
        "jku": "refused:header 'jku'",
        "x5u": "refused:header 'x5u'",
        "jwk": "refused:header 'jwk'",
        "x5c": "refused:header 'x5c'",
    }
    assert figures["after"] == figures["before"]  # not one request, to any path
