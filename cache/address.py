"""Where Redis is: ``REDIS_URL`` parsed into an address the link can dial."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass(frozen=True)
class RedisAddress:
    """A Redis server reached over TCP (``host``/``port``) or a unix socket."""

    host: str = "127.0.0.1"
    port: int = 6379
    unix_path: Optional[str] = None
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = None

    def describe(self) -> str:
        """Where it is, without the password (for logs and errors)."""
        where = f"unix:{self.unix_path}" if self.unix_path else f"{self.host}:{self.port}"
        return f"{where}/{self.db}"


def parse_redis_url(url: str) -> RedisAddress:
    """Parse ``redis://[user:pass@]host[:port][/db]`` or ``unix:///path[?db=N]``.

    Raises ``ValueError`` with a message fit to show the user.
    """
    parts = urlsplit(url)
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs a socket path")
        db = _db(parse_qs(parts.query).get("db", ["0"])[0])
        return RedisAddress(unix_path=parts.path, db=db, username=username, password=password)
    if parts.scheme != "redis":
        raise ValueError(f"unsupported scheme {parts.scheme!r} (use redis:// or unix://)")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError("the port is not a number from 1 to 65535") from None
    return RedisAddress(
        host=parts.hostname or "127.0.0.1",
        port=port,
        db=_db(parts.path.lstrip("/") or "0"),
        username=username,
        password=password,
    )


def _db(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"the database number {text!r} is not a whole number")
    return int(text)
