"""A Lua script as the links send it: its source and SHA-1, called by ``EVALSHA``.

The links (``cache.redis.link``, ``cache.redis.cluster``) load a script with
``SCRIPT LOAD`` where Redis lacks it (a ``NOSCRIPT`` reply, a restart, a
node of a cluster seen for the first time) and call it by SHA; which
scripts there are is the stores' business (``cache.documents.scripts`` and the
modules that keep their own).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Sequence, Tuple, Union

# A script that ends by calling one function of its own names itself by it (``return put(KEYS, ARGV)``).
_CALLED_LAST = re.compile(rb"return ([A-Za-z_][A-Za-z0-9_]*)\(KEYS, ARGV\)\s*\Z")


@dataclass(frozen=True)
class Script:
    """Lua source with its SHA-1, for ``EVALSHA`` with an ``EVAL`` fallback.

    ``name``: what a trace's span calls it (``cache.redis.metered``): the
    function its last line calls, else the first 8 digits of its SHA.
    """

    source: bytes
    sha: bytes = field(init=False)
    name: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())
        called = _CALLED_LAST.search(self.source)
        object.__setattr__(self, "name", called.group(1).decode() if called else self.sha[:8].decode())

    def call(self, keys: Sequence[bytes], args: Sequence[Union[bytes, int]]) -> Tuple[Union[bytes, int], ...]:
        """The ``EVALSHA`` command that runs this script."""
        return (b"EVALSHA", self.sha, len(keys), *keys, *args)
