"""What the tests of tracing share: an OTLP/HTTP receiver in the test process (``tests.tracing.collector``)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.tracing.collector import Collector


@pytest.fixture
def collector() -> Iterator[Collector]:
    receiver = Collector().start()
    try:
        yield receiver
    finally:
        receiver.stop()
