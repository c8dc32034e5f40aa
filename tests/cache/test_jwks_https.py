"""cache.credentials.jwks over https: which certificates ``HttpFetch`` trusts, and that it checks the host's name.

``HttpFetch`` uses ``Agent``'s default TLS policy (``BrowserLikePolicyForHTTPS``):
the certificate must chain to a root of ``platformTrust()`` (OpenSSL's
default verify paths, which ``SSL_CERT_FILE`` replaces) and name the URL's
host (service_identity's check). The suite makes a PKI here with
``cryptography``: a CA the fetching process trusts, through ``SSL_CERT_FILE``
naming the system's bundle plus that CA (what docs/identity.md tells an
operator with a private CA to do), and certificates it must refuse. The
scenarios run in one subprocess started with that variable, each against a
real TLS provider on 127.0.0.1 (no network beyond loopback).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.internet import task
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import PrivateCertificate
from twisted.web.server import Site

from cache.credentials.jwt_tokens import JwtVerifier
from tests.cache.oidc_provider import (
    DISCOVERY,
    Provider,
    claims_for,
    mint,
    outcome,
    public_jwks,
    rsa_key,
    run_scenarios,
)
from tests.cache.oidc_provider import figures as played

pytestmark = pytest.mark.timeout(600)

PKI_VARIABLE = "JETWAY_TEST_PKI"  # where the scenarios find the servers' certificates
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
REFUSAL_TIMEOUT = 5.0  # a refused handshake must end well before this deadline


# -- the PKI --------------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: Optional[Tuple[x509.Certificate, ec.EllipticCurvePrivateKey]],
    names: Sequence[str] = (),
) -> x509.Certificate:
    """A CA's certificate (``names`` empty) or a server's, for ``names`` (DNS names and IP addresses)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, signer = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
    )
    ca = not names
    builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
    builder = builder.add_extension(_key_usage(ca), critical=True)
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(name) for name in names]), False)
    return builder.sign(signer, hashes.SHA256())


def _key_usage(ca: bool) -> x509.KeyUsage:
    """A CA signs certificates; a server signs its handshakes."""
    no = dict(content_commitment=False, key_encipherment=False, data_encipherment=False, key_agreement=False)
    return x509.KeyUsage(
        digital_signature=not ca, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False, **no
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _server_pem(certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bytes:
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return _pem(certificate) + private


def make_pki(directory: Path) -> Path:
    """The servers' certificates (``<name>.pem``, key included) in ``directory``; returns the trusted bundle's path.

    ``good``: the trusted CA's, for localhost and 127.0.0.1; ``other_host``:
    the trusted CA's, for other.test; ``self_signed``: for localhost, signed
    by itself; ``unknown_ca``: for localhost, by a CA nobody trusts.
    """
    ca_key, stranger_key = _key(), _key()
    ca = _certificate("Jetway test CA", ca_key, None)
    stranger = _certificate("Jetway unknown CA", stranger_key, None)
    servers = {
        "good": (ca, ca_key, ["localhost", "127.0.0.1"]),
        "other_host": (ca, ca_key, ["other.test"]),
        "unknown_ca": (stranger, stranger_key, ["localhost", "127.0.0.1"]),
    }
    for name, (signer, signer_key, names) in servers.items():
        key = _key()
        certificate = _certificate(names[0], key, (signer, signer_key), names)
        (directory / f"{name}.pem").write_bytes(_server_pem(certificate, key))
    self_key = _key()
    self_signed = _certificate("localhost", self_key, None, ["localhost", "127.0.0.1"])
    (directory / "self_signed.pem").write_bytes(_server_pem(self_signed, self_key))
    bundle = directory / "trusted.pem"
    bundle.write_bytes(SYSTEM_BUNDLE.read_bytes() + b"\n" + _pem(ca))
    return bundle


# -- the provider over TLS ------------------------------------------------------------------------


def https_provider(reactor: Any, certificate: str, host: str = "localhost", *keys: Any) -> Provider:
    """A ``Provider`` serving TLS with ``<certificate>.pem``, its URLs naming ``host``."""
    provider = Provider()
    provider.jwks = public_jwks(*keys)
    pem = (Path(os.environ[PKI_VARIABLE]) / f"{certificate}.pem").read_bytes()
    options = PrivateCertificate.loadPEM(pem).options()
    provider.port = reactor.listenSSL(0, Site(provider), options, interface="127.0.0.1")
    provider.base = f"https://{host}:{provider.port.getHost().port}"
    return provider


async def _fetched_with(reactor: Any, certificate: str, host: str = "localhost") -> Dict[str, Any]:
    """Start a verifier on an https provider, then judge a token its key signed: what was fetched and said."""
    key = rsa_key("k1")
    provider = https_provider(reactor, certificate, host, key)
    verifier = JwtVerifier([provider.config(fetch_timeout_seconds=REFUSAL_TIMEOUT)], reactor, clock=task.Clock())
    keys = verifier.keys(provider.issuer)
    started = reactor.seconds()
    try:
        await verifier.start()
        seconds = reactor.seconds() - started
        figures = {"kids": list(keys.kids), "fetched": keys.fetched, "error": keys.last_error, "seconds": seconds}
        figures["outcome"] = await outcome(verifier, mint(key, claims_for(provider.issuer)))
        figures["served"] = {"discovery": provider.count(DISCOVERY), "jwks": provider.count("/jwks")}
        figures["label"] = provider.config().label
        return figures
    finally:
        verifier.stop()
        await provider.stop()


# -- scenarios (played in the subprocess) ---------------------------------------------------------


async def scenario_trusted_ca(reactor):
    return await _fetched_with(reactor, "good")


async def scenario_trusted_ca_by_ip_address(reactor):
    return await _fetched_with(reactor, "good", host="127.0.0.1")


async def scenario_without_the_bundle(reactor):
    """The same good server, the variable unset: the system's roots alone do not know the test CA."""
    bundle = os.environ.pop("SSL_CERT_FILE")
    try:
        return await _fetched_with(reactor, "good")
    finally:
        os.environ["SSL_CERT_FILE"] = bundle


async def scenario_self_signed(reactor):
    return await _fetched_with(reactor, "self_signed")


async def scenario_unknown_ca(reactor):
    return await _fetched_with(reactor, "unknown_ca")


async def scenario_another_host_name(reactor):
    return await _fetched_with(reactor, "other_host")


async def scenario_another_host_name_by_ip_address(reactor):
    return await _fetched_with(reactor, "other_host", host="127.0.0.1")


async def scenario_handshake_never_answered(reactor):
    """A server that accepts the connection and never answers the ClientHello: the fetch ends at its deadline."""
    port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
    base = f"https://localhost:{port.getHost().port}"
    provider = Provider()
    provider.base = base
    verifier = JwtVerifier([provider.config(fetch_timeout_seconds=1.0)], reactor, clock=task.Clock())
    keys = verifier.keys(provider.issuer)
    started = reactor.seconds()
    try:
        await verifier.start()
        figures = {"seconds": reactor.seconds() - started, "fetched": keys.fetched, "error": keys.last_error}
        figures["outcome"] = await outcome(verifier, mint(rsa_key("k1"), claims_for(provider.issuer)))
        return figures
    finally:
        verifier.stop()
        await port.stopListening()


# -- the tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> Dict[str, Any]:
    if not SYSTEM_BUNDLE.exists():
        pytest.skip(f"no system CA bundle at {SYSTEM_BUNDLE} to extend")
    directory = tmp_path_factory.mktemp("pki")
    bundle = make_pki(directory)
    return run_scenarios(__name__, env={"SSL_CERT_FILE": str(bundle), PKI_VARIABLE: str(directory)})


def test_service_identity_is_installed_so_names_are_checked_by_it():
    """Without it Twisted warns and falls back to an exact common-name match (``simpleVerifyHostname``)."""
    from twisted.internet import _sslverify

    verify_hostname, _, error = _sslverify._selectVerifyImplementation()
    assert verify_hostname.__module__ == "service_identity.pyopenssl"
    assert error.__module__.startswith("service_identity")


def _refused(figures: Dict[str, Any], why: str) -> None:
    assert figures["fetched"] is False and figures["kids"] == []
    assert why in figures["error"], figures["error"]
    assert "no whole answer" not in figures["error"]  # refused at the handshake, not given up at the deadline
    assert figures["seconds"] < REFUSAL_TIMEOUT
    assert figures["outcome"] == "unavailable"  # IssuerUnavailable: a 503, never a hang
    assert figures["served"] == {"discovery": 0, "jwks": 0}  # no request crossed the refused connection


def test_a_jwks_from_a_ca_in_ssl_cert_file_is_fetched_and_verifies_tokens(scenarios):
    figures = played(scenarios, "trusted_ca")
    assert figures["kids"] == ["k1"] and figures["error"] is None
    assert figures["served"] == {"discovery": 1, "jwks": 1}
    assert figures["label"].startswith("localhost:") and figures["outcome"] == f"ok:oidc:{figures['label']}:alice"


def test_an_ip_address_url_is_checked_against_the_certificates_ip_addresses(scenarios):
    figures = played(scenarios, "trusted_ca_by_ip_address")
    assert figures["kids"] == ["k1"] and figures["label"].startswith("127.0.0.1:")
    assert figures["outcome"] == f"ok:oidc:{figures['label']}:alice"


def test_without_ssl_cert_file_the_same_certificate_is_refused(scenarios):
    _refused(played(scenarios, "without_the_bundle"), "certificate verify failed")


def test_a_self_signed_certificate_is_refused(scenarios):
    _refused(played(scenarios, "self_signed"), "certificate verify failed")


def test_a_certificate_of_an_unknown_ca_is_refused(scenarios):
    _refused(played(scenarios, "unknown_ca"), "certificate verify failed")


def test_a_trusted_certificate_for_another_host_name_is_refused(scenarios):
    _refused(played(scenarios, "another_host_name"), "VerificationError")


def test_a_trusted_certificate_without_the_urls_ip_address_is_refused(scenarios):
    _refused(played(scenarios, "another_host_name_by_ip_address"), "VerificationError")


def test_a_tls_handshake_never_answered_ends_at_the_fetch_deadline(scenarios):
    figures = played(scenarios, "handshake_never_answered")
    assert figures["fetched"] is False and "no whole answer within 1 s" in figures["error"]
    assert 0.9 <= figures["seconds"] < 4.0
    assert figures["outcome"] == "unavailable"
