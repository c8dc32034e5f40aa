"""api.deadline: a connection's one deadline, and a send timeout that counts from the client's last progress."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import task

from api import deadline as deadline_module
from api.deadline import ABORT, CLOSE, Deadline


@pytest.fixture
def unsent(monkeypatch) -> Any:
    """What the transport has not sent: set by the test."""

    class Unsent:
        size = 0

    held = Unsent()
    monkeypatch.setattr(deadline_module, "unsent", lambda transport: held.size)
    return held


def test_a_deadline_passes_once_at_its_time_and_not_when_disarmed(unsent):
    clock = task.Clock()
    deadline = Deadline(clock, None)
    assert not deadline.passed(clock.seconds())
    deadline.arm(10, 408)
    assert not deadline.passed(9.9)
    assert deadline.passed(10) and deadline.action == 408
    assert not deadline.passed(11)  # passed once: disarmed
    deadline.arm(5, CLOSE)
    deadline.disarm()
    assert not deadline.passed(100)


def test_a_send_timeout_counts_again_from_each_progress_of_the_client(unsent):
    clock = task.Clock()
    deadline = Deadline(clock, None)
    unsent.size = 1000
    deadline.arm(30, ABORT)
    clock.advance(29)
    unsent.size = 900  # the client read some: 30 s more from now
    assert not deadline.passed(clock.seconds())
    assert deadline.at == 59
    assert not deadline.passed(58)
    assert deadline.passed(59) and deadline.action == ABORT
