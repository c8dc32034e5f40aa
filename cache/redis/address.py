"""Where Redis is: ``REDIS_URL`` parsed into an address the link can dial.

Besides one server (``redis://``, ``rediss://``, ``unix://``) the URL may
name a group: ``redis-sentinel://h1:26379,h2:26379/mymaster`` (the sentinels
to ask where the master of ``mymaster`` is) or ``redis-cluster://h1:7000,...``
(some nodes of a Redis Cluster, to learn the slot map from; ``rediss-cluster``
for TLS to every node, checked as for ``rediss://``). Either way the
password in the URL is that of the data nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
SINGLE, SENTINEL, CLUSTER = "single", "sentinel", "cluster"
Node = Tuple[str, int]


@dataclass(frozen=True)
class RedisAddress:
    """A Redis server reached over TCP (``host``/``port``) or a unix socket.

    ``tls`` (from ``rediss://``) wraps the TCP connection in TLS, verifying
    the server's certificate and host name against ``ca_path`` (a PEM file of
    one or more CA certificates) or, when that is None, the system's trust
    store: ElastiCache's certificates chain to a public root.

    ``kind`` is ``SINGLE``, or ``SENTINEL`` (``nodes`` are the sentinels,
    ``service`` the master's name) or ``CLUSTER`` (``nodes`` are seeds).
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    unix_path: Optional[str] = None
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = None
    tls: bool = False
    ca_path: Optional[str] = None
    kind: str = SINGLE
    nodes: Tuple[Node, ...] = ()
    service: Optional[str] = None
    # A Sentinel group's: the worker's SentinelWatch (cache.redis.sentinel_watch), which every
    # connection to its master goes through; None: each link finds the master on its own.
    watch: Any = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """Where it is, without the password (for logs and errors)."""
        if self.kind != SINGLE:
            hosts = ",".join(f"{host}:{port}" for host, port in self.nodes)
            where = f"{self.kind} {hosts}" + (f"/{self.service}/{self.db}" if self.service else "")
            return where + (" (TLS)" if self.tls else "")
        where = f"unix:{self.unix_path}" if self.unix_path else f"{self.host}:{self.port}"
        return f"{where}/{self.db}" + (" (TLS)" if self.tls else "")

    def at(self, host: str, port: int) -> RedisAddress:
        """One server of this group, reached with the same credentials and TLS settings."""
        return replace(self, kind=SINGLE, host=host, port=port, unix_path=None, nodes=(), service=None, watch=None)


def parse_redis_url(url: str) -> RedisAddress:
    """Parse ``redis[s]://[user:pass@]host[:port][/db][?ca=/path.pem]``, ``unix:///path[?db=N]``,
    ``redis-sentinel://[user:pass@]h1[:port],h2.../service[?db=N]`` or
    ``redis[s]-cluster://[user:pass@]h1[:port],...[?ca=/path.pem]``.

    Raises ``ValueError`` with a message fit to show the user.
    """
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.scheme in ("redis-sentinel", "redis-cluster", "rediss-cluster"):
        return _parse_group(parts.scheme, parts.netloc, parts.path, query)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs a socket path")
        db = _db(_first(query, "db") or "0")
        return RedisAddress(unix_path=parts.path, db=db, username=username, password=password)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(
            f"unsupported scheme {parts.scheme!r} "
            "(use redis://, rediss://, unix://, redis-sentinel://, redis-cluster:// or rediss-cluster://)"
        )
    tls = parts.scheme == "rediss"
    ca_path = _ca_path(query, tls)
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


def _parse_group(scheme: str, netloc: str, path: str, query: Dict[str, List[str]]) -> RedisAddress:
    # urlsplit cannot take several hosts (its .hostname would be garbage), so
    # the part after the credentials is split here.
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    if scheme == "redis-sentinel":
        service = path.strip("/")
        if not service or "/" in service:
            raise ValueError("a redis-sentinel:// URL names the master after the hosts: .../mymaster")
        kind, default_port, db = SENTINEL, DEFAULT_SENTINEL_PORT, _db(_first(query, "db") or "0")
    else:
        if path.strip("/") not in ("", "0") or _first(query, "db") not in (None, "0"):
            raise ValueError("Redis Cluster has only database 0")
        kind, default_port, db, service = CLUSTER, DEFAULT_PORT, 0, None
    tls = scheme == "rediss-cluster"
    return RedisAddress(
        kind=kind,
        nodes=tuple(_node(text, default_port) for text in hosts.split(",")),
        service=unquote(service) if service else None,
        db=db,
        username=unquote(username) or None,
        password=unquote(password) or None,
        tls=tls,
        ca_path=_ca_path(query, tls),
    )


def _node(text: str, default_port: int) -> Node:
    """``host``, ``host:port`` or ``[v6 address]:port``."""
    parts = urlsplit("//" + text)
    try:
        port = parts.port or default_port
    except ValueError:
        raise ValueError(f"the port in {text!r} is not a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"{text!r} is not a host[:port]")
    return parts.hostname, port


def _ca_path(query: Dict[str, List[str]], tls: bool) -> Optional[str]:
    ca_path = _first(query, "ca")
    if ca_path is not None:
        if not tls:
            raise ValueError("?ca= is for rediss:// and rediss-cluster:// (TLS) URLs")
        _check_ca_file(ca_path)
    return ca_path


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
