"""The test process on PyPy runs no incremental major collection of its own accord."""

from __future__ import annotations

import gc
from typing import List

import pytest

from tests.pypy_gc_guard import IS_PYPY

pytestmark = pytest.mark.skipif(not IS_PYPY, reason="the guard works around a PyPy collector bug")


@pytest.fixture
def major_collection_steps() -> List[object]:
    """Every major-collection step PyPy reports while the test runs."""
    steps: List[object] = []
    gc.hooks.on_gc_collect_step = steps.append
    try:
        yield steps
    finally:
        gc.hooks.on_gc_collect_step = None


def churn(megabytes: int) -> None:
    """Allocate objects that survive the nursery, enough to start major collections."""
    survivors: List[List[int]] = []
    for i in range(megabytes * 1024 // 4):
        survivors.append([i] * 128)  # ~1 KB each
        if len(survivors) > 20_000:
            survivors = survivors[10_000:]


def test_no_major_collection_starts_by_itself(major_collection_steps: List[object]) -> None:
    churn(400)
    assert major_collection_steps == []


def test_an_explicit_collection_still_runs(major_collection_steps: List[object]) -> None:
    gc.collect()
    assert major_collection_steps, "the hook saw nothing: the first test would prove nothing"
