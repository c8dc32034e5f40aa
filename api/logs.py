"""Logging: one JSON object per line (the default), or plain text.

Each line has ``time``, ``level``, ``namespace`` and ``message``, plus the
access log's fields (``request_id``, ``method``, ``path``, ``status``,
``client``, ``duration_ms``) when it is an access line, and ``error`` with a
traceback when one was logged.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Dict, TextIO

from twisted.logger import formatEvent, globalLogBeginner, textFileLogObserver

FIELDS = ("request_id", "method", "path", "status", "client", "duration_ms", "pid")


def start_logging(stream: TextIO, as_json: bool) -> None:
    observer = json_observer(stream) if as_json else textFileLogObserver(stream)
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def json_observer(stream: TextIO) -> Any:
    def observe(event: Dict[str, Any]) -> None:
        level = event.get("log_level")
        record: Dict[str, Any] = {
            "time": datetime.fromtimestamp(event.get("log_time", 0), timezone.utc).isoformat(timespec="milliseconds"),
            "level": getattr(level, "name", "info"),
            "namespace": event.get("log_namespace", "-"),
            "message": formatEvent(event),
        }
        record.update((name, event[name]) for name in FIELDS if event.get(name) is not None)
        failure = event.get("log_failure")
        if failure is not None:
            record["error"] = failure.getTraceback()
        stream.write(json.dumps(record, default=str) + "\n")
        stream.flush()

    return observe
