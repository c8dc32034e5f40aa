"""An NDJSON body read line by line in groups, in bounded memory; and an import's report.

``LineReader`` takes a ``BodyStream`` (``handlers.http.body_stream``) and
gives its lines in groups: each line's number (from 1) and bytes, without
its ``\\n`` (nor a ``\\r`` before it). A line longer than ``max_line`` is
not kept: it is given as ``None`` (too large) and the rest of it is
skipped as it arrives, so the reader holds at most ``max_line`` bytes of a
line besides what one read brought. Blank lines are counted, not given.
When the body ends early (the connection closed, its timeout), the lines
read whole are given and ``error`` says why it ended; a last line with no
``\\n`` is given only if the body ended normally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from twisted.internet import defer

from handlers.http.body_stream import BodyStream
from handlers.http.errors import ApiError

Line = Tuple[int, Optional[bytes]]  # its number, its bytes (None: longer than the limit)
MAX_REFUSALS_LISTED = 1000


class LineReader:
    def __init__(self, stream: BodyStream, max_line: int) -> None:
        self.stream = stream
        self.max_line = max_line
        self.number = 0
        self.ended = False
        self.error: Optional[Exception] = None
        # What arrived and is not yet a line; the bytes before ``_scanned`` hold no newline. Appended in place
        # and searched only where it was not searched before, so a long line in small pieces costs linear time.
        self._pending = bytearray()
        self._scanned = 0
        self.scanned_bytes = 0  # bytes searched for a newline, in all: what tests hold to linear
        self._skipping = False  # the rest of a line that was too long

    @defer.inlineCallbacks
    def group(self, size: int) -> Any:
        """Up to ``size`` lines; fewer only at the end of the body (then ``ended``)."""
        lines: List[Line] = []
        while True:
            self._split(lines, size)
            if len(lines) >= size or self.ended:
                return lines
            try:
                data = yield self.stream.read(b"\n")
            except Exception as error:  # BodyLost, or the connection's 408/400 as an ApiError
                self.error, self.ended = error, True
                return lines
            if data:
                self._pending += data
                continue
            self.ended = True
            if self._pending and not self._skipping:
                self._give(lines, bytes(self._pending))
            self._pending, self._scanned = bytearray(), 0

    def _split(self, lines: List[Line], size: int) -> None:
        pending, start = self._pending, 0
        while len(lines) < size:
            end = pending.find(b"\n", max(start, self._scanned))
            self.scanned_bytes += (end + 1 if end >= 0 else len(pending)) - max(start, self._scanned)
            if end < 0:
                self._scanned = len(pending)
                break
            if self._skipping:
                self._skipping = False
            else:
                self._give(lines, bytes(pending[start:end]))
            start = end + 1
        if start:
            del pending[:start]
            self._scanned = max(0, self._scanned - start)
        if len(lines) >= size:
            return  # what is left is searched by the next group's split
        if not self._skipping and len(pending) > self.max_line:
            self.number += 1
            lines.append((self.number, None))
            self._skipping = True
        if self._skipping:
            del pending[:]  # the rest of a line too long, up to its newline, is not kept
            self._scanned = 0

    def _give(self, lines: List[Line], line: bytes) -> None:
        self.number += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self.max_line:
            lines.append((self.number, None))
        elif line.strip(b" \t"):
            lines.append((self.number, line))


@dataclass
class ImportReport:
    """What an import did: counts, and its refused lines (the first ``MAX_REFUSALS_LISTED`` listed)."""

    resumed_after: int = 0
    created: int = 0
    replaced: int = 0
    skipped: int = 0
    refused: int = 0
    last_line: int = 0
    refusals: List[Dict[str, Any]] = field(default_factory=list)

    def count_written(self, created: Optional[bool]) -> None:
        """A line's write: created, replaced, or (None) found written before by this import's plan."""
        if created is None:
            self.skipped += 1
        elif created:
            self.created += 1
        else:
            self.replaced += 1

    def refuse(self, number: int, error: ApiError) -> None:
        self.refused += 1
        if len(self.refusals) < MAX_REFUSALS_LISTED:
            problem = error.as_problem()
            problem.pop("title", None)
            self.refusals.append({"line": number, **problem})

    def as_json(self, complete: bool) -> Dict[str, Any]:
        return {
            "complete": complete,
            "written": self.created + self.replaced,
            "created": self.created,
            "replaced": self.replaced,
            "refused": self.refused,
            "skipped": self.skipped,
            "resumed_after": self.resumed_after,
            "last_line": self.last_line,
            "refusals": self.refusals,
            "refusals_listed": len(self.refusals),
        }
