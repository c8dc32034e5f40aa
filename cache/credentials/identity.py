"""Who a verified OpenID Connect token stands for: its issuer, its subject and its verified claims.

Kept apart from ``cache.credentials.jwt_tokens`` so that ``TokenRecord``
(``cache.credentials.tokens``) can name it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Identity:
    """An end user as a trusted issuer vouched for them, until ``expires`` (the token's ``exp``)."""

    issuer: str
    subject: str
    # The key that signed the token: a cached verification is refused once it leaves the issuer's JWKS.
    kid: str
    expires: float
    # Read-only: every claim of the token, as signed (per-document rules compare one of them).
    claims: Mapping[str, Any]
    # The key object that verified the signature; None for a ticket's snapshot (judged by ``kid`` alone).
    key: Any = field(default=None, compare=False, repr=False)
