"""The OpenID Connect issuers the operator trusts, read from a JSON file (never from a request).

The app names the file in ``JETWAY_OIDC_ISSUERS``. It holds one object,
``{"issuers": [ ... ]}``, each issuer an object of the members of ``Issuer``
below; only ``issuer`` and ``audience`` are required. Every member is cast
and checked once, at start: an unknown member (a typo), a wrong type or a
value out of range is an ``IssuerConfigError`` naming the file, the issuer
and the member, never a default silently taken. What a token carries selects
among these issuers and nothing else: its ``iss`` must equal one exactly.

Only asymmetric algorithms are accepted. With HMAC the verification key is
the signing key, so an ``HS256`` allowed beside ``RS256`` lets anyone sign
with the issuer's *public* key (the classic confusion); ``none`` is no
signature at all. Both are refused here, before any token is seen.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from cache.credentials.tokens import SCOPE_PATTERN
from cache.json.codec import JsonError, loads

ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ("RS256", "ES256")
LOOPBACK_NAMES = ("localhost",)
# An issuers file is a few hundred bytes per issuer; a larger one is a wrong path, not a configuration.
MAX_FILE_BYTES = 1024 * 1024
MAX_ISSUERS = 64


class IssuerConfigError(ValueError):
    """The issuers file cannot be used; the message names the file and the member."""


@dataclass(frozen=True)
class Issuer:
    """One trusted issuer and how its tokens become Jetway grants."""

    issuer: str
    audience: str
    algorithms: Tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway_seconds: int = 30
    # A space-separated string or a list of strings; a value matching SCOPE_PATTERN is a grant.
    scope_claim: str = "scope"
    # Stripped first; with a prefix set, only values carrying it count (another API's bare "admin" is not ours).
    scope_prefix: str = ""
    # Scopes every user of this issuer holds, whatever the token says.
    grants: Tuple[str, ...] = ()
    subject_claim: str = "sub"
    # The JWKS is fetched again every refresh_seconds, and at most once per refresh_seconds for an unknown kid.
    refresh_seconds: int = 60
    jwks_uri: Optional[str] = None
    max_jwks_bytes: int = 256 * 1024
    fetch_timeout_seconds: float = 5.0

    @property
    def discovery_uri(self) -> str:
        """OpenID Connect Discovery 1.0, section 4: the issuer, less a trailing slash, and the well-known path."""
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"

    @property
    def label(self) -> str:
        """Host and path of the issuer (two realms on one host differ by path), for record names."""
        parts = urlsplit(self.issuer)
        return parts.netloc + parts.path.rstrip("/")


def url_problem(url: Any) -> Optional[str]:
    """Why ``url`` may not be fetched from or trusted as an issuer, or None.

    https, or plain http to a loopback host only (a test's or a sidecar's
    provider): keys fetched in clear over a network could be replaced on the way.
    """
    if not isinstance(url, str) or not url:
        return "must be a URL string"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 -- raises ValueError on a malformed port
    except ValueError as error:
        return f"is not a valid URL ({error})"
    if parts.scheme not in ("https", "http") or not host:
        return "must be an https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user or password"
    if parts.query or parts.fragment or "#" in url or "?" in url:
        return "must not have a query or fragment"
    if not url.isascii():
        return "must be ASCII (write an international host name in its xn-- form)"
    if parts.scheme == "http" and not _loopback(host):
        return "must use https (plain http only to 127.0.0.1, ::1 or localhost)"
    return None


def _loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_issuers(path: str) -> Tuple[Issuer, ...]:
    """The issuers the file at ``path`` names; raises ``IssuerConfigError`` naming the file and the member."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise IssuerConfigError(f"{path}: cannot read the issuers file ({error.strerror or error})") from None
    if len(data) > MAX_FILE_BYTES:
        raise IssuerConfigError(f"{path}: over {MAX_FILE_BYTES} bytes; is this the issuers file?")
    try:
        document = loads(data)
    except JsonError as error:
        raise IssuerConfigError(f"{path}: not valid JSON ({error})") from None
    return parse_issuers(document, path)


def parse_issuers(document: Any, source: str) -> Tuple[Issuer, ...]:
    """The issuers of a parsed issuers file; ``source`` names it in the errors."""
    if not isinstance(document, dict) or set(document) != {"issuers"}:
        raise IssuerConfigError(f'{source}: must be an object with one member, "issuers" (a list of issuers)')
    entries = document["issuers"]
    if not isinstance(entries, list) or not entries:
        raise IssuerConfigError(f'{source}: "issuers" must be a non-empty list of issuer objects')
    if len(entries) > MAX_ISSUERS:
        raise IssuerConfigError(f'{source}: "issuers" names {len(entries)} issuers; at most {MAX_ISSUERS}')
    issuers: List[Issuer] = []
    for index, entry in enumerate(entries):
        issuer = _issuer(entry, f"{source}: issuers[{index}]")
        if any(seen.issuer == issuer.issuer for seen in issuers):
            raise IssuerConfigError(f"{source}: issuers[{index}]: issuer {issuer.issuer!r} is named twice")
        issuers.append(issuer)
    return tuple(issuers)


def _issuer(entry: Any, where: str) -> Issuer:
    if not isinstance(entry, dict):
        raise IssuerConfigError(f"{where}: must be an object")
    if isinstance(entry.get("issuer"), str):
        where = f"{where} ({entry['issuer']})"
    unknown = sorted(set(entry) - set(_MEMBERS))
    if unknown:
        raise IssuerConfigError(f"{where}: unknown member {unknown[0]!r} (known: {', '.join(_MEMBERS)})")
    for required in ("issuer", "audience"):
        if required not in entry:
            raise IssuerConfigError(f"{where}: member {required!r} is required")
    values: Dict[str, Any] = {}
    for name, value in entry.items():
        check, meaning = _MEMBERS[name]
        try:
            values[name] = check(value)
        except ValueError as error:
            detail = str(error) or meaning
            raise IssuerConfigError(f"{where}: member {name!r} {detail}, not {_shown(value)}") from None
    return Issuer(**values)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _url(value: Any) -> str:
    problem = url_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError
    return value


def _prefix(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError
    return value


def _algorithms(value: Any) -> Tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        raise ValueError
    for name in value:
        if name.lower() == "none" or name.upper().startswith("HS"):
            raise ValueError(f"may not hold {name!r}: only asymmetric algorithms ({', '.join(ASYMMETRIC_ALGORITHMS)})")
        if name not in ASYMMETRIC_ALGORITHMS:
            raise ValueError(
                f"holds unknown algorithm {name!r}: each must be one of {', '.join(ASYMMETRIC_ALGORITHMS)}"
            )
    if len(set(value)) != len(value):
        raise ValueError("names an algorithm twice")
    return tuple(value)


def _grants(value: Any) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(scope, str) for scope in value):
        raise ValueError
    for scope in value:
        if not SCOPE_PATTERN.match(scope):
            raise ValueError(f"holds {scope!r}: each must be admin, read:<coll>, write:<coll>, read:* or write:*")
    return tuple(dict.fromkeys(value))


def _integer(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError
        return value

    return check


def _seconds(low: float, high: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError
        return float(value)

    return check


# Each member: its check (raises ValueError, perhaps with a better message) and what it must be.
_MEMBERS: Dict[str, Tuple[Callable[[Any], Any], str]] = {
    "issuer": (_url, "must be the issuer's URL"),
    "audience": (_text, "must be a non-empty string (the aud this API's tokens carry)"),
    "algorithms": (_algorithms, "must be a non-empty list of algorithm names"),
    "leeway_seconds": (_integer(0, 300), "must be an integer from 0 to 300"),
    "scope_claim": (_text, "must be a non-empty claim name"),
    "scope_prefix": (_prefix, "must be a string of at most 64 characters"),
    "grants": (_grants, "must be a list of scopes"),
    "subject_claim": (_text, "must be a non-empty claim name"),
    "refresh_seconds": (_integer(1, 86_400), "must be an integer from 1 to 86400"),
    "jwks_uri": (_url, "must be the JWKS URL"),
    "max_jwks_bytes": (_integer(1024, 16 * 1024 * 1024), "must be an integer from 1024 to 16777216"),
    "fetch_timeout_seconds": (_seconds(0.1, 60), "must be a number of seconds from 0.1 to 60"),
}
