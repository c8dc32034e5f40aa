"""TLS for ``rediss://``: how the link checks the Redis server it dials.

The server's certificate must chain to a trusted CA and name the host in the
URL (an IP address in the URL must be in the certificate's IP SANs). The
trusted CAs are the PEM file from ``?ca=`` when given (a private CA, a
test), else the system's trust store. There is no switch to skip checking:
a Redis that cannot be verified is a Redis that cannot be reached (503).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List

from twisted.internet.endpoints import wrapClientTLS
from twisted.internet.ssl import Certificate, optionsForClientTLS, platformTrust, trustRootFromCertificates

from cache.redis.address import RedisAddress

_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def wrap_tls(address: RedisAddress, endpoint: Any) -> Any:
    """``endpoint`` speaking TLS to ``address``, verified as described above."""
    return wrapClientTLS(optionsForClientTLS(address.host, trustRoot=_trust_root(address)), endpoint)


def _trust_root(address: RedisAddress) -> Any:
    if address.ca_path is None:
        return platformTrust()
    return trustRootFromCertificates(load_certificates(Path(address.ca_path)))


def load_certificates(path: Path) -> List[Certificate]:
    """Every certificate in a PEM file (a bundle may hold several)."""
    found = [Certificate.loadPEM(block) for block in _PEM_CERTIFICATE.findall(path.read_bytes())]
    if not found:
        raise ValueError(f"{path} holds no PEM certificate")
    return found
