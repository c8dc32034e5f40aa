"""The directory where every process of an instance keeps its metrics.

Kept apart from ``api.observe`` on purpose: ``prometheus_client`` decides at
import time whether it runs in multiprocess mode, so the master must set
``PROMETHEUS_MULTIPROC_DIR`` before anything imports it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from typing import Iterator

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def metrics_directory() -> Iterator[str]:
    """Where every process of this instance keeps its metrics (``PROMETHEUS_MULTIPROC_DIR``).

    A directory the user set is emptied of a previous run's files; otherwise
    a private one is made, and removed when the master exits.
    """
    given = os.environ.get(MULTIPROC_ENV)
    directory = given or tempfile.mkdtemp(prefix="jetway-metrics-")
    for stale in glob.glob(os.path.join(directory, "*.db")):
        os.remove(stale)
    os.environ[MULTIPROC_ENV] = directory
    try:
        yield directory
    finally:
        if not given:
            shutil.rmtree(directory, ignore_errors=True)
