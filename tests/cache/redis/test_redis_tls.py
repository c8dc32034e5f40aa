"""``rediss://``: Jetway talks TLS to Redis and checks whom it talks to.

A real ``redis-server`` listens with TLS only (``--port 0 --tls-port P``),
with a CA and a server certificate (for 127.0.0.1) that this module makes
and throws away. Jetway must store and read through it when told to trust
that CA, and must refuse it (503) when the certificate does not verify.
"""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Tuple

import pytest
import redis
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cache.redis.address import parse_redis_url
from tests.support import JetwayServer, free_port, keys_cli, make_token, stop_process, wait_until

JSON = {"Content-Type": "application/json"}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def make_ca(common_name: str) -> Tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, client_too: bool = False
) -> Tuple[object, x509.Certificate]:
    """A certificate for 127.0.0.1 only (no DNS name), signed by the CA.

    ``client_too``: also for client use, as a cluster node presents it to its peers.
    """
    usages = [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    if client_too:
        usages.append(x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("jetway test redis"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


@dataclass
class TlsRedis:
    port: int
    ca: Path
    rogue_ca: Path

    def url(self, host: str = "127.0.0.1", ca: Optional[Path] = None) -> str:
        return f"rediss://{host}:{self.port}/0" + (f"?ca={ca}" if ca else "")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(self.ca))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    directory = tmp_path_factory.mktemp("redis-tls")
    ca_key, ca_cert = make_ca("jetway test CA")
    server_key, server_cert = make_server_cert(ca_key, ca_cert)
    _, rogue_cert = make_ca("someone else's CA")
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (directory / "rogue-ca.pem").write_bytes(rogue_cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.pem").write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, directory / "server.key")
    server = TlsRedis(free_port(), directory / "ca.pem", directory / "rogue-ca.pem")
    command = [
        "redis-server",
        *("--port", "0", "--bind", "127.0.0.1", "--tls-port", str(server.port)),
        *("--tls-cert-file", str(directory / "server.pem"), "--tls-key-file", str(directory / "server.key")),
        *("--tls-ca-cert-file", str(server.ca), "--tls-auth-clients", "no"),
        *("--save", "", "--appendonly", "no", "--dir", str(directory)),
    ]
    with open(directory / "redis.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: server.client().ping(), 10, "redis-server with TLS to answer")
        yield server
    finally:
        stop_process(process)


@pytest.fixture
def start_jetway(tmp_path: Path) -> Iterator:
    """Starts Jetways (one worker each) on a given REDIS_URL; stops them all."""
    started = []

    def start(redis_url: str, auth: bool = False) -> JetwayServer:
        env = {"JETWAY_AUTH": "on" if auth else "off", "JETWAY_REDIS_TIMEOUT": "1"}
        server = JetwayServer(redis_url, tmp_path / f"jetway-{len(started)}.log", env=env)
        started.append(server)
        return server.start(["--workers", "1"])

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def test_put_and_get_a_document_through_rediss(tls_redis, start_jetway):
    client = tls_redis.client()
    client.flushall()
    jetway = start_jetway(tls_redis.url(ca=tls_redis.ca))
    body = b'{"name":"ada","tls":true}'
    put = requests.put(jetway.url("/v1/users/u1"), data=body, headers=JSON, timeout=10)
    assert put.status_code == 201, put.text
    got = requests.get(jetway.url("/v1/users/u1"), timeout=10)
    assert (got.status_code, got.content) == (200, body)
    assert requests.get(jetway.url("/readyz"), timeout=10).status_code == 200
    assert client.dbsize() > 0  # it really went to the TLS-only server


@pytest.mark.slow
def test_tokens_are_made_checked_and_revoked_over_rediss(tls_redis, start_jetway):
    """The keys CLI, the token lookups and each worker's revocation channel (pub/sub) all speak TLS."""
    tls_redis.client().flushall()
    url = tls_redis.url(ca=tls_redis.ca)
    token = make_token(url, "over-tls", "admin")
    jetway = start_jetway(url, auth=True)
    subscribed = lambda: any(int(client["sub"]) > 0 for client in tls_redis.client().client_list())  # noqa: E731
    wait_until(subscribed, 10, "the worker's revocation channel to subscribe over TLS")
    headers = {"Authorization": f"Bearer {token}"}
    assert requests.get(jetway.url("/v1/users/nobody"), headers=headers, timeout=10).status_code == 404
    assert requests.get(jetway.url("/v1/users/nobody"), timeout=10).status_code == 401
    assert keys_cli(url, "revoke", "over-tls").returncode == 0
    wait_until(
        lambda: requests.get(jetway.url("/v1/users/nobody"), headers=headers, timeout=10).status_code == 401,
        2,
        "the revocation to reach the worker",
    )


@pytest.mark.parametrize(
    "case",
    ["the CA in ?ca= did not sign the server's certificate", "no ?ca=: the system trust store lacks the test CA"],
)
def test_a_server_certificate_that_does_not_verify_is_refused_503(tls_redis, start_jetway, case):
    ca = tls_redis.rogue_ca if case.startswith("the CA") else None
    jetway = start_jetway(tls_redis.url(ca=ca))
    ready = requests.get(jetway.url("/readyz"), timeout=10)
    assert ready.status_code == 503, ready.text
    put = requests.put(jetway.url("/v1/users/u1"), data=b"{}", headers=JSON, timeout=10)
    assert put.status_code == 503, put.text
    assert "Retry-After" in put.headers


def test_a_certificate_for_another_host_name_is_refused_503(tls_redis, start_jetway):
    """Trusted CA, but the certificate names 127.0.0.1 and the URL says localhost."""
    jetway = start_jetway(tls_redis.url(host="localhost", ca=tls_redis.ca))
    assert requests.get(jetway.url("/readyz"), timeout=10).status_code == 503


def test_rediss_url_parsing(tls_redis):
    address = parse_redis_url(f"rediss://:pw@cache.example:6380/2?ca={tls_redis.ca}")
    assert (address.tls, address.ca_path, address.host, address.port, address.db) == (
        True,
        str(tls_redis.ca),
        "cache.example",
        6380,
        2,
    )
    assert parse_redis_url("rediss://cache.example").port == 6379
    assert parse_redis_url("rediss://cache.example").ca_path is None  # the system trust store
    assert parse_redis_url("redis://cache.example").tls is False
    assert "TLS" in parse_redis_url("rediss://:pw@h/0").describe()
    assert "pw" not in parse_redis_url("rediss://:pw@h/0").describe()


@pytest.mark.parametrize(
    "url, message",
    [
        ("redis://h/0?ca=/etc/hostname", "?ca= is for rediss://"),
        ("rediss://h/0?ca=/no/such/ca.pem", "cannot read the CA file"),
        ("rediss://h/0?ca=/etc/hostname", "holds no PEM certificate"),
        ("http://h/0", "unsupported scheme"),
    ],
)
def test_bad_rediss_urls_say_what_is_wrong(url, message):
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        parse_redis_url(url)
