"""Logging: one JSON object per line (the default), or plain text for a terminal.

Each JSON line has ``time``, ``level``, ``namespace`` and ``message``, plus
the access log's fields (``request_id``, ``trace_id``, ``method``, ``path``,
``status``, ``client``, ``duration_ms``) when it is an access line, the
event's ``jetway_fields`` (a worker's ``pid`` and ``slot`` on its start line), and
``error`` with a traceback when one was logged. A text line is
``time level message``, an access line's ids after it as ``key=value``,
a traceback on the lines after it (docs/operations.md, "Logs").

Levels: ``info`` for starts and stops, ``warn`` when an operator should look
(a worker died, Redis unreachable), ``error``/``critical`` for a failure with
its traceback. ``debug`` is not written. Twisted's own chatter (factories and
ports starting and stopping) is dropped here, in one place (``chatter``).

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
import re
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Optional, Protocol, TextIO

from twisted.logger import LogLevel, formatEvent, globalLogBeginner

Observer = Callable[[Dict[str, Any]], None]


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
    observer = json_observer(stream) if as_json else text_observer(stream)
    globalLogBeginner.beginLoggingTo([without_chatter(observer)], redirectStandardIO=False)


# Twisted's lines about itself, which say nothing to an operator: every
# factory's start and stop (``Factory.doStart``/``doStop`` while ``noisy``,
# the default), every listening port's start and close (``tcp.Port``,
# ``unix.Port``, ``udp.Port``, through the legacy ``log.msg``), the reactor's
# last line, and each retry of a ``ClientService`` (every Redis connection's,
# several a second per worker while Redis is down: what an operator needs of
# that is the warnings of the hot cache and the expiry sweep). A worker made
# about thirty of them as it started, its warm-ups' connections among them.
# Their texts as Twisted 25.5 writes them (twisted/internet/protocol.py,
# tcp.py, unix.py, udp.py, base.py, twisted/application/_client_service.py):
# an upgrade that changes them shows in tests/process/test_make_run.py.
_TWISTED_FORMATS = frozenset(
    {
        "Starting factory {factory!r}",
        "Stopping factory {factory!r}",
        "Main loop terminated.",
        "Scheduling retry {attempt} to connect {endpoint} in {delay} seconds.",
    }
)
_TWISTED_LEGACY = re.compile(r"\S+ starting on \S+|\((?:TCP |UNIX |UDP )?Port \S+ Closed\)")


def chatter(event: Dict[str, Any]) -> bool:
    """Whether ``event`` is Twisted's talk about itself, or below ``info``: not written."""
    if event.get("log_level") is LogLevel.debug or event.get("log_format") in _TWISTED_FORMATS:
        return True
    return (
        event.get("log_namespace") == "log_legacy" and _TWISTED_LEGACY.fullmatch(event.get("log_text", "")) is not None
    )


def without_chatter(observer: Observer) -> Observer:
    def observe(event: Dict[str, Any]) -> None:
        if not chatter(event):
            observer(event)

    return observe


def json_observer(stream: TextIO) -> Observer:
    def observe(event: Dict[str, Any]) -> None:
        level = event.get("log_level")
        # Access lines (with their own fields) come from ``AccessLog``, not here.
        fields = dict(event.get("jetway_fields", ()))
        failure = event.get("log_failure")
        if failure is not None:
            fields["error"] = failure.getTraceback()
        namespace = event.get("log_namespace", "-")
        stream.write(
            json_line(event.get("log_time", 0), getattr(level, "name", "info"), namespace, formatEvent(event), fields)
        )
        stream.flush()

    return observe


def text_observer(stream: TextIO) -> Observer:
    """Lines for a terminal: ``time level message``, a traceback on the lines after.

    An event's ``jetway_fields`` are left out: they repeat what its message says, for a machine reading JSON.
    """

    def observe(event: Dict[str, Any]) -> None:
        level = getattr(event.get("log_level"), "name", "info")
        failure = event.get("log_failure")
        error = "\n" + failure.getTraceback().rstrip("\n") if failure is not None else ""
        stream.write(text_line(event.get("log_time", 0), level, formatEvent(event) + error))
        stream.flush()

    return observe


def text_time(when: float) -> str:
    """``when`` as a text line starts: UTC, to the millisecond."""
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def text_line(when: float, level: str, message: str) -> str:
    return f"{text_time(when)} {level:<5} {message}\n"


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
    return str(hundredths // 100) + _HUNDREDTHS[hundredths % 100]


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
            request = f" request_id={request_id}" if request_id else ""
            trace = f" trace_id={trace_id}" if trace_id else ""
            line = text_line(now, "info", f"{method} {path} {status} ({client}) {duration_ms}ms{request}{trace}")
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
        # Joined with +, not an f-string: PyPy's JIT builds a + chain in one buffer, where an f-string cost this
        # line several times the time and allocation (docs/history/performance.md, "Strings on PyPy").
        code = str(status)
        ids = ""
        if request_id:
            ids = '"request_id": "' + request_id + '", '
        if trace_id:
            ids += '"trace_id": "' + trace_id + '", '
        message = self._prefix + method + " " + path + " " + code + " (" + client + ") " + duration_ms + 'ms", '
        fields = '"method": "' + method + '", "path": "' + path + '", "status": ' + code + ', "client": "' + client
        return message + ids + fields + '", "duration_ms": ' + duration_ms + "}\n"

    def flush(self) -> None:
        """Write what is pending (also called as the worker shuts down, so no line is lost)."""
        if self._flushing is not None and self._flushing.active():
            self._flushing.cancel()
        self._flushing = None
        self._lines.flush()
