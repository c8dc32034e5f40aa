"""On PyPy, the test process runs major collections whole, between tests.

Debian bookworm's PyPy 7.3.11 has a garbage-collector bug, fixed in 7.3.16
(pypy/pypy#4928): an array copied while an incremental major collection is
marking can leave a live object unmarked, and the process later crashes with a
segmentation fault. pytest's assertion rewriting (``ast.parse`` and
``compile`` of every test module) is where it strikes most often
(pytest-dev/pytest#11168), and CI hit it there once, while collecting.

A collection started by ``gc.collect()`` runs to the end in one go, so no
program code runs while it marks. This plugin therefore turns the automatic,
incremental major collections off in the test process and calls
``gc.collect()`` itself: after collecting the tests, and every few tests so
memory stays bounded. CPython is left alone. Worker processes the suite
starts are not covered: they serve with PyPy's normal collector, as in
production (docs/operations.md, "Operating it": the known runtime bug).
"""

from __future__ import annotations

import gc
import platform

import pytest

IS_PYPY = platform.python_implementation() == "PyPy"
# About a second of collecting over the whole suite; the heap grows by a few
# megabytes between two collections.
TESTS_PER_COLLECTION = 20

_tests_since_collection = 0


def pytest_configure(config: pytest.Config) -> None:
    if IS_PYPY:
        gc.collect()
        gc.disable()  # on PyPy this stops automatic major collections


def pytest_collection_finish(session: pytest.Session) -> None:
    if IS_PYPY:
        gc.collect()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    global _tests_since_collection
    if not IS_PYPY:
        return
    _tests_since_collection += 1
    if _tests_since_collection >= TESTS_PER_COLLECTION:
        _tests_since_collection = 0
        gc.collect()


def pytest_unconfigure(config: pytest.Config) -> None:
    if IS_PYPY:
        gc.enable()
