"""Whether a value is a Deferred, at the cost of a class attribute lookup.

Twisted's ``Deferred`` is an ``Awaitable``, so ``isinstance(x, Deferred)``
goes through ``ABCMeta.__instancecheck__``: on PyPy a lookup in the ABC's
caches per call, and the read path asked three times a request (a visible
share of an in-process read's samples, ``python -m loadtest.studies._request_path
--profile get``). Twisted's own callback loop avoids it for the same reason.
"""

from __future__ import annotations

from typing import Any


def is_deferred(value: Any) -> bool:
    """True for a ``Deferred`` (or a subclass): whatever has Twisted's ``addCallbacks``."""
    return getattr(type(value), "addCallbacks", None) is not None
