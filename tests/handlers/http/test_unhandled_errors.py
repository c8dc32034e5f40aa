"""A bug in a handler: a 500 for the client, one error line with its traceback for the operator (not critical)."""

from __future__ import annotations

from typing import Any, Dict, List

from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from handlers.http.problems import problem_of


def _logged(failure: Any) -> List[Dict[str, Any]]:
    logged: List[Dict[str, Any]] = []
    globalLogPublisher.addObserver(logged.append)
    try:
        problem = problem_of(failure, "GET", "/v1/things/1")
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert (problem.status_code, problem.problem) == (500, "internal")
    return [event for event in logged if "log_failure" in event]


def _raise() -> None:
    raise ValueError("a bug")


def test_an_unhandled_exception_is_an_error_line_with_its_traceback() -> None:
    try:
        _raise()
    except ValueError as error:
        caught = error
    for failure in (caught, Failure(caught)):
        [event] = _logged(failure)
        assert event["log_level"] is LogLevel.error
        assert formatEvent(event) == "unhandled error in GET /v1/things/1"
        traceback = event["log_failure"].getTraceback()
        assert "_raise" in traceback and "ValueError: a bug" in traceback
