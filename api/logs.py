"""Logging: one JSON object per line (the default), or plain text.

Each line has ``time``, ``level``, ``namespace`` and ``message``, plus the
access log's fields (``request_id``, ``method``, ``path``, ``status``,
``client``, ``duration_ms``) when it is an access line, and ``error`` with a
traceback when one was logged.

Access lines do not go through ``twisted.logger``: ``AccessLog`` formats
them itself and hands the lines of one reactor turn to the worker's
``api.log_writer.LineWriter`` together. Through the logger (event dict,
format-string parsing, the observer chain, a write and a flush per line), a
document read with its access line cost the worker measurably more CPU
than it does this way (``loadtest/ab_cpu.sh``; docs/history/performance.md,
"The changes, in the order done"). The worker's other lines go to the same
writer (``LineStream``), so all of its lines keep their order.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Dict, Optional, Protocol, TextIO

from twisted.logger import formatEvent, formatTime, globalLogBeginner, textFileLogObserver


class Lines(Protocol):
    """Where lines go: ``api.log_writer.LineWriter`` in a worker, ``api.log_relay.Relay`` in the master."""

    def add(self, line: str) -> None: ...

    def flush(self) -> None: ...


class LineStream:
    """A text stream over ``Lines``, for ``twisted.logger``'s observers (each writes and flushes a line)."""

    def __init__(self, lines: Lines) -> None:
        self.lines = lines

    def write(self, text: str) -> None:
        self.lines.add(text)

    def flush(self) -> None:
        self.lines.flush()


def start_logging(stream: TextIO, as_json: bool) -> None:
    observer = json_observer(stream) if as_json else textFileLogObserver(stream)
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def json_observer(stream: TextIO) -> Any:
    def observe(event: Dict[str, Any]) -> None:
        level = event.get("log_level")
        # Access lines (with their own fields) come from ``AccessLog``, not here.
        failure = event.get("log_failure")
        fields = {"error": failure.getTraceback()} if failure is not None else {}
        namespace = event.get("log_namespace", "-")
        stream.write(
            json_line(event.get("log_time", 0), getattr(level, "name", "info"), namespace, formatEvent(event), fields)
        )
        stream.flush()

    return observe


def json_line(when: float, level: str, namespace: str, message: str, fields: Dict[str, Any]) -> str:
    """One log line: the same four keys first on every line, then ``fields``."""
    record: Dict[str, Any] = {
        "time": datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="milliseconds"),
        "level": level,
        "namespace": namespace,
        "message": message,
        **fields,
    }
    return json.dumps(record, default=str) + "\n"


# A duration's hundredths of a millisecond after the point, as a float's repr
# prints them: ".0", ".01", ..., ".1", ..., ".99".
_HUNDREDTHS = tuple(f".{n // 10}" if n % 10 == 0 else f".{n:02d}" for n in range(100))


def milliseconds(seconds: float) -> str:
    """``seconds`` in milliseconds to two places, as ``round(seconds * 1000, 2)`` prints.

    By integer arithmetic: on PyPy a ``round`` to places and a float's repr
    each go through dtoa, and an access line took one and two of them, each
    dearer than this (docs/history/performance.md, "The changes, in the
    order done"). A duration below zero (the wall clock stepped back) is 0.
    """
    hundredths = max(0, int(seconds * 100_000 + 0.5))
    return f"{hundredths // 100}{_HUNDREDTHS[hundredths % 100]}"


class AccessLog:
    """One line per request, in the worker's log format, written once per reactor turn."""

    NAMESPACE = "jetway.access"

    def __init__(self, lines: Lines, as_json: bool, clock: Any) -> None:
        self._lines = lines
        self._as_json = as_json
        self._clock = clock
        self._flushing: Optional[Any] = None
        self._prefix_at = -1
        self._prefix = ""
        self._second_at = -1
        self._second = ""
        # On the workers' reactor (api.event_loop) a poll's lines are written
        # as its events are done; on another clock, by a timer at the next turn.
        after_each_poll = getattr(clock, "after_each_poll", None)
        self._each_poll = after_each_poll is not None
        if after_each_poll is not None:
            after_each_poll(lines.flush)

    def request(
        self, method: str, path: str, status: int, client: str, seconds: float, request_id: str, trace_id: str = ""
    ) -> None:
        """One request's line; ``seconds``: how long it took; ``trace_id``: the request's trace, if it is traced."""
        now = self._clock.seconds()
        duration_ms = milliseconds(seconds)
        if self._as_json:
            line = self._json_line(now, method, path, status, client, duration_ms, request_id, trace_id)
        else:
            message = f"{method} {path} {status} ({client}) {duration_ms}ms"
            trace = f" trace_id={trace_id}" if trace_id else ""
            line = f"{formatTime(now)} [{self.NAMESPACE}#info] {message}{trace}\n"
        self._lines.add(line)
        if self._flushing is None and not self._each_poll:
            # Next reactor turn: every line of this turn in one write.
            self._flushing = self._clock.callLater(0, self.flush)

    def _json_line(
        self,
        now: float,
        method: str,
        path: str,
        status: int,
        client: str,
        duration_ms: str,
        request_id: str,
        trace_id: str,
    ) -> str:
        """``json_line``'s output for an access line, formatted by hand (tests/api/test_logs.py holds them equal).

        Of the fields only the path may hold a character JSON escapes (the
        request line allows ``"`` and ``\\``): the method is a token, the
        client an address, the request id ``[A-Za-z0-9._:-]``, the trace id
        hex. The time
        prefix is made once per millisecond.
        """
        if '"' in path or "\\" in path:
            path = json.dumps(path)[1:-1]
        millisecond = int(now * 1000)
        if millisecond != self._prefix_at:
            self._prefix_at = millisecond
            second, fraction = divmod(millisecond, 1000)
            if second != self._second_at:
                # The date and time to the second, through datetime once a second.
                self._second_at = second
                self._second = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
            moment = f"{self._second}.{fraction:03d}+00:00"
            self._prefix = f'{{"time": "{moment}", "level": "info", "namespace": "{self.NAMESPACE}", "message": "'
        request = f'"request_id": "{request_id}", ' if request_id else ""
        if trace_id:
            request += f'"trace_id": "{trace_id}", '
        return (
            f'{self._prefix}{method} {path} {status} ({client}) {duration_ms}ms", {request}"method": "{method}", '
            f'"path": "{path}", "status": {status}, "client": "{client}", "duration_ms": {duration_ms}}}\n'
        )

    def flush(self) -> None:
        """Write what is pending (also called as the worker shuts down, so no line is lost)."""
        if self._flushing is not None and self._flushing.active():
            self._flushing.cancel()
        self._flushing = None
        self._lines.flush()
