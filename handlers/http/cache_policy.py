"""The ``Cache-Control`` an operator sets for documents and list pages, checked once.

The default, ``no-cache``, lets browsers and CDNs keep a document but makes
them revalidate it with its stored ETag (a 304 costs one Redis read and no
body); ``private``, ``max-age=N``, ``no-store`` and the other response
directives of RFC 9111 5.2.2 (and RFC 5861, RFC 8246) can be given instead,
comma-separated. A value is checked when it is set (environment or
collection settings), so a typo is refused there rather than sent to every
cache on the way.
"""

from __future__ import annotations

import re
from typing import Optional

DEFAULT_POLICY = "no-cache"
# Errors are never worth keeping: a 404 or a 503 is heuristically cacheable otherwise.
ERROR_POLICY = "no-store"
_FLAGS = frozenset(
    {
        "public",
        "private",
        "no-cache",
        "no-store",
        "no-transform",
        "must-revalidate",
        "proxy-revalidate",
        "must-understand",
        "immutable",
    }
)
_SECONDS = frozenset({"max-age", "s-maxage", "stale-while-revalidate", "stale-if-error"})
_DIRECTIVE = re.compile(r"([a-z-]+)(?:=(\d{1,10}))?\Z")


def cache_policy(text: str) -> str:
    """``text`` as a normalized ``Cache-Control`` value; ``ValueError`` saying what is wrong."""
    directives = []
    for part in text.split(","):
        directive = part.strip().lower()
        match = _DIRECTIVE.match(directive)
        name, seconds = match.groups() if match else (directive, None)
        if (name in _FLAGS and seconds is None) or (name in _SECONDS and seconds is not None):
            directives.append(directive)
        elif name in _SECONDS:
            raise ValueError(f"{name} needs a number of seconds ({name}=N)")
        else:
            raise ValueError(f"{directive!r} is not a Cache-Control response directive")
    names = [directive.partition("=")[0] for directive in directives]
    if len(set(names)) != len(names):
        raise ValueError("a directive is given twice")
    if "public" in names and "private" in names:
        raise ValueError("public and private contradict each other")
    return ", ".join(directives)


def policy_for(stored: Optional[str], default: str) -> str:
    """The ``Cache-Control`` of a collection's documents: its own policy if it set one, else the operator's."""
    return default if stored is None else stored
