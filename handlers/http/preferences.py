"""The ``Prefer`` header (RFC 7240) of a list page or a query: which count it asks for, if any.

``count=exact`` and ``count=estimated`` are the preferences Jetway applies
(``cache.indexes.counts``), and says so in ``Preference-Applied``. As RFC
7240 says, a preference the server does not know, or cannot fulfil
(``count=planned``, ``count=nonsense``, ``return=minimal`` on a GET), is
ignored; as PostgREST does, ``handling=strict`` asks instead for a 400
(``invalid-preference``) naming each such one. Only read when a request
carries ``Prefer``: a page that asks no count pays nothing for it.
"""

from __future__ import annotations

from typing import List, Optional

from handlers.http.errors import bad_request

COUNTS = ("exact", "estimated")


def count_asked(header: str) -> Optional[str]:
    """The count ``header`` (the request's ``Prefer``, repeated ones joined by commas) asks for: ``exact``,
    ``estimated`` or None; a 400 ``invalid-preference`` when it says ``handling=strict`` beside one
    Jetway would ignore."""
    count: Optional[str] = None
    strict = False
    ignored: List[str] = []
    for written in header.split(","):
        # A preference's own parameters (";p=v") change nothing here; token and value are case-insensitive.
        token, _, value = written.split(";", 1)[0].strip().partition("=")
        token, value = token.strip().lower(), value.strip().strip('"').lower()
        if not token:
            continue
        if token == "count" and value in COUNTS and count is None:
            count = value
        elif token == "handling" and value in ("strict", "lenient"):
            strict = value == "strict"
        else:
            ignored.append(written.strip()[:40])
    if strict and ignored:
        raise bad_request(
            f"Prefer: handling=strict, and Jetway does not apply {', '.join(ignored[:5])} here (a list page or a"
            f" query applies count=exact or count=estimated)",
            "invalid-preference",
        )
    return count
