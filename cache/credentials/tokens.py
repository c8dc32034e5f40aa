"""API tokens in Redis: only a SHA-256 of each token is ever stored.

Layout (one hash tag, so every change is one script even on Redis Cluster;
the token records are few and small):

    jw:{tokens}:t:<sha256 hex>   HASH  name, scopes (space-separated), rate
                                       ("" or "N/s", "N/m", "N/h"), expires
                                       (unix seconds, 0 = never), created
    jw:{tokens}:n:<name>         STRING the sha256 hex of the name's token
    jw:{tokens}:names            ZSET   every name (score 0), for listing

Revoking or rotating publishes the old hash on ``CHANGED_CHANNEL`` inside
the same script, so every worker that cached it drops it at once.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from twisted.internet import defer

from cache.credentials.identity import Identity
from cache.redis.link import Link
from cache.redis.script import Script

CHANGED_CHANNEL = b"jw:tokens:changed"
_TAG = b"jw:{tokens}"
NAMES_KEY = _TAG + b":names"
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
SCOPE_PATTERN = re.compile(r"(admin|(read|write):(\*|[a-z][a-z0-9_-]{0,63}))\Z")
RATE_PATTERN = re.compile(r"([1-9][0-9]{0,8})/(s|m|h)\Z")
_PERIODS = {"s": 1, "m": 60, "h": 3600}
TOKEN_BYTES = 32


class TokenError(ValueError):
    """A token request that cannot be done; the message says why."""


@dataclass(frozen=True)
class TokenRecord:
    digest: bytes
    name: str
    scopes: Tuple[str, ...]
    rate: str
    expires: int
    created: int
    # Who a verified OpenID Connect token stands for (cache.credentials.jwt_tokens); None: one of Jetway's own.
    identity: Optional[Identity] = None

    def expired(self, now: float) -> bool:
        return bool(self.expires) and now >= self.expires

    def rate_limit(self) -> Optional[Tuple[int, int]]:
        """``(requests, period in seconds)``, or None without a rate."""
        match = RATE_PATTERN.match(self.rate)
        if not match:
            return None
        return int(match.group(1)), _PERIODS[match.group(2)]


def digest_of(token: str) -> bytes:
    # digest().hex(), not hexdigest(): PyPy's hexdigest is a Python loop over
    # the bytes, and this runs on every authorized request. Same result
    # (docs/performance.md, "The read path").
    return hashlib.sha256(token.encode("utf-8")).digest().hex().encode()


def token_key(digest: bytes) -> bytes:
    return _TAG + b":t:" + digest


def name_key(name: str) -> bytes:
    return _TAG + b":n:" + name.encode()


def new_token() -> str:
    return "jw_" + base64.urlsafe_b64encode(os.urandom(TOKEN_BYTES)).rstrip(b"=").decode()


# KEYS: name key, new token key, names. ARGV: name, digest, scopes, rate, expires, created.
_CREATE = Script(
    b"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], 'name', ARGV[1], 'scopes', ARGV[3], 'rate', ARGV[4], 'expires', ARGV[5], 'created', ARGV[6])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return 1
"""
)

# KEYS: name key, names. ARGV: name, the key prefix of token records, channel.
_REVOKE = Script(
    b"""
local digest = redis.call('GET', KEYS[1])
if not digest then return 0 end
redis.call('DEL', ARGV[2] .. digest, KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], digest)
return 1
"""
)

# KEYS: name key. ARGV: new digest, the key prefix of token records, channel.
_ROTATE = Script(
    b"""
local old = redis.call('GET', KEYS[1])
if not old then return 0 end
redis.call('RENAME', ARGV[2] .. old, ARGV[2] .. ARGV[1])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[3], old)
return 1
"""
)


class TokenStore:
    """Create, list, revoke and rotate tokens; look one up by its digest."""

    def __init__(self, link: Link, clock: Callable[[], float] = time.time) -> None:
        self._link = link
        self._clock = clock

    @defer.inlineCallbacks
    def create(self, name: str, scopes: List[str], rate: str = "", expires_in: Optional[int] = None) -> Any:
        """Make a token; fires with the token itself, which is never stored."""
        _check(name, scopes, rate)
        token = new_token()
        now = int(self._clock())
        expires = now + expires_in if expires_in else 0
        created = yield self._link.run_script(
            _CREATE,
            [name_key(name), token_key(digest_of(token)), NAMES_KEY],
            [name, digest_of(token), " ".join(scopes), rate, expires, now],
        )
        if not created:
            raise TokenError(f"a token named {name!r} exists already (revoke or rotate it)")
        return token

    @defer.inlineCallbacks
    def revoke(self, name: str) -> Any:
        done = yield self._link.run_script(
            _REVOKE, [name_key(name), NAMES_KEY], [name, token_key(b""), CHANGED_CHANNEL]
        )
        if not done:
            raise TokenError(f"no token named {name!r}")

    @defer.inlineCallbacks
    def rotate(self, name: str) -> Any:
        """Replace the name's token by a new one with the same grants."""
        token = new_token()
        done = yield self._link.run_script(
            _ROTATE, [name_key(name)], [digest_of(token), token_key(b""), CHANGED_CHANNEL]
        )
        if not done:
            raise TokenError(f"no token named {name!r}")
        return token

    @defer.inlineCallbacks
    def lookup(self, digest: bytes) -> Any:
        """The record of a token digest, or None."""
        fields = yield self._link.execute(
            b"HMGET", token_key(digest), b"name", b"scopes", b"rate", b"expires", b"created"
        )
        if fields[0] is None:
            return None
        name, scopes, rate, expires, created = (value.decode() for value in fields)
        return TokenRecord(digest, name, tuple(scopes.split()), rate, int(expires), int(created))

    @defer.inlineCallbacks
    def list(self) -> Any:
        """Every token's record (never the token), by name."""
        names = yield self._link.execute(b"ZRANGE", NAMES_KEY, 0, -1)
        digests = yield self._link.pipeline([(b"GET", name_key(name.decode())) for name in names]) if names else []
        records = []
        for digest in digests:
            if digest is not None:
                record = yield self.lookup(digest)
                if record is not None:
                    records.append(record)
        return records


def _check(name: str, scopes: List[str], rate: str) -> None:
    if not NAME_PATTERN.match(name):
        raise TokenError(f"name {name!r} must match ^[A-Za-z0-9._-]{{1,64}}$")
    if not scopes:
        raise TokenError("a token needs at least one scope")
    for scope in scopes:
        if not SCOPE_PATTERN.match(scope):
            raise TokenError(f"scope {scope!r} must be admin, read:<coll>, write:<coll>, read:* or write:*")
    if rate and not RATE_PATTERN.match(rate):
        raise TokenError(f"rate {rate!r} must look like 1000/s, 600/m or 10000/h")
