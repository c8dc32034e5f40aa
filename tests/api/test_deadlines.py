"""The application's deadline sweep: due connections time out, and one failure does not stop the sweep."""

from __future__ import annotations

from typing import Any, Dict, List

from twisted.internet import task
from twisted.logger import globalLogPublisher

from api.application import DEADLINE_TICK, JetwayApplication
from api.connection import HttpLimits
from api.observe import Metrics, Observer


class Connection:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.checked: List[float] = []

    def check_deadline(self, now: float) -> None:
        self.checked.append(now)
        if self.fail:
            raise RuntimeError("a broken timeout")


def test_the_sweep_checks_every_connection_each_tick_and_survives_an_error():
    clock = task.Clock()
    app = JetwayApplication([], clock, HttpLimits(), Observer(Metrics(), None))
    broken, healthy = Connection(fail=True), Connection()
    app.connections.update({broken, healthy})  # type: ignore[arg-type]
    logged: List[Dict[str, Any]] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        app.listen_on(None)
        clock.advance(DEADLINE_TICK)
        clock.advance(DEADLINE_TICK)
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert healthy.checked == [DEADLINE_TICK, 2 * DEADLINE_TICK]
    assert len(broken.checked) == 2
    assert sum("log_failure" in event for event in logged) == 2
