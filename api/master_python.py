"""The master on an interpreter of its own (``JETWAY_MASTER_PYTHON``), its workers on the one it was started with.

The master binds sockets, runs the workers and relays their lines: no
request passes through it, so PyPy's JIT buys it nothing, while PyPy's own
image makes it more than twice the resident size of a CPython one with the
same imports (docs/operations.md, "Memory"). ``python -m api serve`` started
on PyPy with ``JETWAY_MASTER_PYTHON`` naming another interpreter (one with
``requirements.txt`` installed: ``make setup-cpython`` makes ``.venv-cpython``)
execs that one, same pid, before any import; it runs the workers on the
interpreter the command was started with (``--worker-python``, which the
exec adds). The interpreter is checked first: one that is not
there, or cannot import what the master needs, is a one-line error and exit
code 2, never a master that dies as it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, MutableMapping, Optional

from api.master_gc import put_back, remembered

MASTER_PYTHON = "JETWAY_MASTER_PYTHON"
# Set for the exec'd image only: the operator's PYTHONPATH (null: unset), put back before the workers start.
MARKER = "JETWAY_MASTER_PYTHONPATH_ORIGINAL"
# What the master imports beyond the standard library, and so what the interpreter must have.
MASTER_NEEDS = "import twisted.internet.process, prometheus_client, cyclone, txredisapi"
CHECK_TIMEOUT = 30.0
# The directory holding the ``api`` package, put first on the master's path so ``-m api`` finds this code.
CODE_ROOT = str(Path(__file__).resolve().parent.parent)


class MasterPythonError(Exception):
    """``JETWAY_MASTER_PYTHON`` names an interpreter the master cannot run on; the message says why."""


def master_python(environ: Mapping[str, str]) -> Optional[str]:
    """The interpreter to exec the master on, or None: run it here (unset, already exec'd, or this one)."""
    chosen = environ.get(MASTER_PYTHON, "")
    if not chosen or MARKER in environ:
        return None
    if os.path.realpath(chosen) == os.path.realpath(sys.executable):
        return None
    return chosen


def exec_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """The master's environment on the other interpreter: this code first on its path, the operator's
    PYTHONPATH remembered (``api.master_gc.remembered``)."""
    path = environ.get("PYTHONPATH")
    return remembered(environ, {"PYTHONPATH": CODE_ROOT + (os.pathsep + path if path else "")}, MARKER)


def restore(environ: MutableMapping[str, str]) -> None:
    """Put back the operator's PYTHONPATH (the exec'd image calls this, so its workers find the code as the
    command did: a release's workers follow ``current``, docs/deploy.md)."""
    put_back(environ, MARKER)


def check(python: str, environment: Mapping[str, str]) -> None:
    """Raise ``MasterPythonError`` unless ``python`` runs and imports what the master needs."""
    if not os.access(python, os.X_OK) or os.path.isdir(python):
        raise MasterPythonError(f"{MASTER_PYTHON}={python}: no such interpreter (not an executable file)")
    try:
        ran = subprocess.run(
            [python, "-c", MASTER_NEEDS],
            env=dict(environment),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=CHECK_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MasterPythonError(f"{MASTER_PYTHON}={python}: it does not run ({error})") from None
    if ran.returncode != 0:
        lines = ran.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
        raise MasterPythonError(
            f"{MASTER_PYTHON}={python}: it cannot import what the master needs ({lines[-1]}); "
            "install requirements.txt in it (make setup-cpython)"
        )


def exec_on_master_python(argv: List[str]) -> None:
    """``python -m api serve ...`` (``argv``) exec'd on ``JETWAY_MASTER_PYTHON`` when it names another interpreter,
    with ``--worker-python`` this one (it does not return then); exit 2 with a line on stderr when that
    interpreter cannot run the master. In the exec'd image: the operator's PYTHONPATH put back."""
    python = master_python(os.environ)
    if python is None:
        restore(os.environ)
        return
    environment = exec_environment(os.environ)
    try:
        check(python, environment)
    except MasterPythonError as error:
        print(f"jetway: {error}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.flush()
    os.execve(python, [python, "-m", "api", argv[0], "--worker-python", sys.executable, *argv[1:]], environment)
