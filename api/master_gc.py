"""The master's own PyPy garbage-collector settings, apart from the workers'.

When ``PYPY_GC_NURSERY`` is unset, PyPy sizes its nursery from the CPU's
last-level cache, which on a large-cache server is hundreds of MB; the
start's imports alone run through all of it, so a master that allocates
little once it runs stayed as large as that nursery. PyPy reads the
variable only as it starts, so ``python -m api serve`` on PyPy execs itself
once (same pid, nothing opened yet) with ``MASTER_GC_ENVIRONMENT`` added,
and the new image puts the operator's own values back before anything else
runs: the workers get theirs (``api.master.worker_environment``). The
figures: docs/operations.md, "Memory". That bookkeeping (``remembered``,
``put_back``) is also ``api.master_python``'s, for its PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Mapping, MutableMapping, Optional

# Small: the master only supervises and relays log lines in large reads.
MASTER_GC_ENVIRONMENT = {"PYPY_GC_NURSERY": "1MB"}
# Set for the exec'd image only: the operator's values of the names above (null: unset).
MARKER = "JETWAY_MASTER_GC_ORIGINAL"


def remembered(environ: Mapping[str, str], values: Mapping[str, str], marker: str) -> Dict[str, str]:
    """``environ`` with ``values`` set, and under ``marker`` the operator's own values of those names (null: unset),
    for an exec'd image to put back (``put_back``) before its children start."""
    original = {name: environ.get(name) for name in values}
    return {**environ, **values, marker: json.dumps(original)}


def put_back(environ: MutableMapping[str, str], marker: str) -> None:
    """Put back the operator's values that ``remembered`` saved under ``marker``, if it did."""
    original = json.loads(environ.pop(marker, "{}"))
    for name, value in original.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def exec_environment(environ: MutableMapping[str, str]) -> Optional[Dict[str, str]]:
    """The environment to exec the master with, or None if this image already runs with it."""
    if MARKER in environ:
        return None
    return remembered(environ, MASTER_GC_ENVIRONMENT, MARKER)


def restore(environ: MutableMapping[str, str]) -> None:
    """Put back the operator's values of what ``exec_environment`` set (the exec'd image calls this)."""
    put_back(environ, MARKER)


def exec_with_master_gc(argv: List[str]) -> None:
    """On PyPy: exec this command again with the master's GC settings (it does not return); then restore."""
    if sys.implementation.name != "pypy":
        return
    environment = exec_environment(os.environ)
    if environment is None:
        restore(os.environ)
        return
    os.execve(sys.executable, [sys.executable, "-m", "api", *argv], environment)
