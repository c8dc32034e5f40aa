"""api.logs: the access line formatted by hand is the line ``json_line`` makes; Twisted's chatter is not written;
the text and JSON lines' shapes."""

from __future__ import annotations

import io
import json
import random
import re
from typing import Any, List

import pytest
from twisted.internet import task
from twisted.internet.protocol import Factory
from twisted.logger import Logger, LogLevel, LogPublisher

from api.logs import AccessLog, json_line, json_observer, milliseconds, text_observer, without_chatter


class Collected:
    """``Lines`` kept in a list; ``flushed`` is what has been flushed."""

    def __init__(self) -> None:
        self.waiting: List[str] = []
        self.flushed = ""

    def add(self, line: str) -> None:
        self.waiting.append(line)

    def flush(self) -> None:
        self.flushed += "".join(self.waiting)
        self.waiting = []


CASES = [
    ("GET", "/v1/users/u1", 200, "127.0.0.1", 0.00042, "0123456789abcdef0123456789abcdef"),
    ("PUT", '/v1/a/b?q="x"\\y', 201, "::1", 0.012, ""),
    ("DELETE", "/v1/a/b", 204, "unix", 0.0035, "req-1.2:3"),
    ("GET", "/healthz", 404, "10.0.0.1", 1e-08, "r"),
    ("GET", "/slow", 200, "10.0.0.1", 61.2345678, "r"),
]


@pytest.mark.parametrize("when", [1_700_000_000.0, 1_700_000_000.6095, 1_700_000_001.25])
@pytest.mark.parametrize(("method", "path", "status", "client", "seconds", "request_id"), CASES)
def test_an_access_line_is_what_json_line_makes(when, method, path, status, client, seconds, request_id):
    clock = task.Clock()
    clock.advance(when)
    lines = Collected()
    log = AccessLog(lines, True, clock)
    log.request(method, path, status, client, seconds, request_id)
    log.flush()
    duration_ms = round(seconds * 1000, 2)
    fields = {"request_id": request_id} if request_id else {}
    fields.update(method=method, path=path, status=status, client=client, duration_ms=duration_ms)
    message = f"{method} {path} {status} ({client}) {duration_ms}ms"
    expected = json_line(when, "info", AccessLog.NAMESPACE, message, fields)
    assert lines.flushed == expected
    assert json.loads(lines.flushed)["path"] == path


@pytest.mark.parametrize("request_id", ["0123456789abcdef0123456789abcdef", ""])
def test_a_traced_requests_access_line_carries_its_trace_id(request_id):
    clock = task.Clock()
    clock.advance(1_700_000_000.25)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    lines = Collected()
    log = AccessLog(lines, True, clock)
    log.request("GET", "/v1/a/b", 200, "::1", 0.001, request_id, trace_id=trace_id)
    log.flush()
    fields = {"request_id": request_id} if request_id else {}
    fields.update(trace_id=trace_id, method="GET", path="/v1/a/b", status=200, client="::1", duration_ms=1.0)
    message = "GET /v1/a/b 200 (::1) 1.0ms"
    assert lines.flushed == json_line(clock.seconds(), "info", AccessLog.NAMESPACE, message, fields)
    text = Collected()
    log = AccessLog(text, False, clock)
    log.request("GET", "/v1/a/b", 200, "::1", 0.001, request_id, trace_id=trace_id)
    log.flush()
    assert f"trace_id={trace_id}" in text.flushed


def test_a_duration_prints_as_its_milliseconds_rounded_to_two_places_would():
    chosen = random.Random(5)
    durations = [chosen.uniform(0, 0.05) for _ in range(20_000)] + [chosen.uniform(0, 100) for _ in range(2_000)]
    durations += [0.0, 0.001, 0.0105, 0.01, 0.1, 1.0, 0.00999, 12.5]
    for seconds in durations:
        exact = seconds * 100_000
        if abs(exact - int(exact) - 0.5) < 1e-6:
            continue  # a half-way case: round() rounds the binary value to even, this rounds up
        assert milliseconds(seconds) == repr(round(seconds * 1000, 2)), seconds
    assert milliseconds(-0.002) == "0.0"


def test_the_lines_of_one_reactor_turn_are_flushed_together_at_its_end():
    clock = task.Clock()
    lines = Collected()
    log = AccessLog(lines, True, clock)
    for n in range(3):
        log.request("GET", f"/healthz?{n}", 200, "127.0.0.1", 0.0001, "")
    assert lines.flushed == "" and len(lines.waiting) == 3
    clock.advance(0)
    paths = [json.loads(line)["path"] for line in lines.flushed.splitlines()]
    assert paths == ["/healthz?0", "/healthz?1", "/healthz?2"]


class PollingClock(task.Clock):
    """A clock with the workers' reactor's ``after_each_poll`` (api.event_loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.after_poll: List[Any] = []

    def after_each_poll(self, call: Any) -> None:
        self.after_poll.append(call)

    def polled(self) -> None:
        for call in self.after_poll:
            call()


def test_on_the_workers_reactor_a_polls_lines_are_written_as_its_events_are_done():
    clock = PollingClock()
    lines = Collected()
    log = AccessLog(lines, True, clock)
    for n in range(3):
        log.request("GET", f"/healthz?{n}", 200, "127.0.0.1", 0.0001, "")
    assert clock.getDelayedCalls() == []  # no timer per turn
    assert lines.flushed == "" and len(lines.waiting) == 3
    clock.polled()
    paths = [json.loads(line)["path"] for line in lines.flushed.splitlines()]
    assert paths == ["/healthz?0", "/healthz?1", "/healthz?2"]


def test_access_lines_keep_their_time_across_milliseconds_and_seconds():
    """One log's lines, each second and millisecond made once and reused: each line as json_line makes it."""
    clock = task.Clock()
    log = AccessLog(Collected(), True, clock)
    for when in (1_700_000_000.9985, 1_700_000_000.9989, 1_700_000_000.9991, 1_700_000_001.0004, 1_700_000_061.5):
        clock.advance(when - clock.seconds())
        lines = log._lines = Collected()
        log.request("GET", "/a", 200, "::1", 0.001, "r")
        log.flush()
        fields = {"request_id": "r", "method": "GET", "path": "/a", "status": 200, "client": "::1", "duration_ms": 1.0}
        assert lines.flushed == json_line(when, "info", AccessLog.NAMESPACE, "GET /a 200 (::1) 1.0ms", fields)


def logged(as_json: bool, emit: Any, legacy_texts: Any = ()) -> List[str]:
    """The lines ``start_logging``'s observer writes for what ``emit(logger)`` logs (its chatter filter included)."""
    stream = io.StringIO()
    observer = without_chatter(json_observer(stream) if as_json else text_observer(stream))
    publisher = LogPublisher(observer)
    emit(Logger(namespace="tests.logs", observer=publisher))
    # As the legacy ``log.msg`` reaches twisted.logger (Twisted's ports write so): its text as ``log_text``.
    legacy = Logger(namespace="log_legacy", observer=publisher)
    for text in legacy_texts:
        legacy.info("{log_text}", log_text=text)
    return stream.getvalue().splitlines()


def test_twisteds_talk_about_its_factories_and_ports_is_not_written():
    factory = Factory()

    def emit(log: Logger) -> None:
        log.info("Starting factory {factory!r}", factory=factory)
        log.info("Stopping factory {factory!r}", factory=factory)
        log.info("Main loop terminated.")
        log.info(
            "Scheduling retry {attempt} to connect {endpoint} in {delay} seconds.",
            attempt=1,
            endpoint=factory,
            delay=0.2,
        )
        log.debug("hot cache: live ({count} invalidation connections)", count=1)
        log.info("JetwayApplication starting on 42431")  # not Twisted's (not a legacy line): written
        log.warn("worker of slot {slot} ended", slot=0)

    legacy = ("JetwayApplication starting on 42431", "(TCP Port 42431 Closed)", "(UNIX Port '/tmp/s' Closed)")
    for as_json in (True, False):
        lines = logged(as_json, emit, (*legacy, "reloading: replacing workers one at a time"))
        assert len(lines) == 3, lines
        assert not any("factory" in line or "0x" in line or "Closed" in line for line in lines)


def test_a_text_line_is_time_level_message_and_its_traceback_after():
    def emit(log: Logger) -> None:
        log.info("worker {slot} serving", slot=1, jetway_fields={"pid": 7, "slot": 1})
        try:
            raise ValueError("boom")
        except ValueError:
            log.failure("warm-up failed", level=LogLevel.warn)

    first, second, *traceback = logged(False, emit)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z info  worker 1 serving", first), first
    assert re.fullmatch(r"\S+Z warn  warm-up failed", second), second
    assert traceback[0].startswith("Traceback") and traceback[-1] == "builtins.ValueError: boom", traceback


def test_a_json_line_carries_the_events_fields_and_its_error():
    def emit(log: Logger) -> None:
        log.info("worker {slot} serving", slot=1, jetway_fields={"pid": 7, "slot": 1})
        try:
            raise ValueError("boom")
        except ValueError:
            log.failure("warm-up failed", level=LogLevel.warn)

    serving, failed = (json.loads(line) for line in logged(True, emit))
    assert list(serving) == ["time", "level", "namespace", "message", "pid", "slot"]
    assert (serving["level"], serving["namespace"], serving["message"], serving["pid"]) == (
        "info",
        "tests.logs",
        "worker 1 serving",
        7,
    )
    assert failed["level"] == "warn" and "ValueError: boom" in failed["error"]


def test_a_text_access_line_carries_its_ids_as_key_values():
    clock = task.Clock()
    clock.advance(1_700_000_000.25)
    lines = Collected()
    log = AccessLog(lines, False, clock)
    log.request("GET", "/v1/a/b", 200, "::1", 0.001, "r-1")
    log.request("GET", "/v1/a/b", 200, "::1", 0.001, "r-2", trace_id="4bf92f35" * 4)
    log.flush()
    assert lines.flushed.splitlines() == [
        "2023-11-14T22:13:20.250Z info  GET /v1/a/b 200 (::1) 1.0ms request_id=r-1",
        "2023-11-14T22:13:20.250Z info  GET /v1/a/b 200 (::1) 1.0ms request_id=r-2 trace_id=" + "4bf92f35" * 4,
    ]
