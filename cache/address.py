"""Where Redis is: ``REDIS_URL`` parsed into an address the link can dial."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisAddress:
    """A Redis server reached over TCP (``host``/``port``) or a unix socket.

    ``tls`` (from ``rediss://``) wraps the TCP connection in TLS, verifying
    the server's certificate and host name against ``ca_path`` (a PEM file of
    one or more CA certificates) or, when that is None, the system's trust
    store: ElastiCache's certificates chain to a public root.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    unix_path: Optional[str] = None
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = None
    tls: bool = False
    ca_path: Optional[str] = None

    def describe(self) -> str:
        """Where it is, without the password (for logs and errors)."""
        where = f"unix:{self.unix_path}" if self.unix_path else f"{self.host}:{self.port}"
        return f"{where}/{self.db}" + (" (TLS)" if self.tls else "")


def parse_redis_url(url: str) -> RedisAddress:
    """Parse ``redis[s]://[user:pass@]host[:port][/db][?ca=/path.pem]`` or ``unix:///path[?db=N]``.

    Raises ``ValueError`` with a message fit to show the user.
    """
    parts = urlsplit(url)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    query = parse_qs(parts.query)
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs a socket path")
        db = _db(_first(query, "db") or "0")
        return RedisAddress(unix_path=parts.path, db=db, username=username, password=password)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"unsupported scheme {parts.scheme!r} (use redis://, rediss:// or unix://)")
    tls = parts.scheme == "rediss"
    ca_path = _first(query, "ca")
    if ca_path is not None:
        if not tls:
            raise ValueError("?ca= is for rediss:// (TLS) URLs")
        _check_ca_file(ca_path)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError("the port is not a number from 1 to 65535") from None
    return RedisAddress(
        host=parts.hostname or "127.0.0.1",
        port=port,
        db=_db(parts.path.lstrip("/") or "0"),
        username=username,
        password=password,
        tls=tls,
        ca_path=ca_path,
    )


def _check_ca_file(path: str) -> None:
    try:
        with open(path, "rb") as pem:
            text = pem.read()
    except OSError as error:
        raise ValueError(f"cannot read the CA file {path!r}: {error.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(f"the CA file {path!r} holds no PEM certificate")


def _first(query: Dict[str, List[str]], name: str) -> Optional[str]:
    values = query.get(name)
    return values[0] if values else None


def _db(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"the database number {text!r} is not a whole number")
    return int(text)
