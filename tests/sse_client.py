"""A small Server-Sent Events client for the tests, over a plain socket.

It reads the response as a browser's ``EventSource`` would: HTTP/1.1 chunks
(or a body delimited by the connection's close), then SSE lines, and
counts an event only once its blank line has arrived. An event with an
``id:`` and no data (a live query's place, past events not its own) is not
dispatched, as ``EventSource`` does not: it only moves ``last_id``. It can drop the
connection at any moment, mid-chunk included, as a flaky network would.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Event:
    name: str = "message"
    data: str = ""
    id: Optional[str] = None
    retry: Optional[int] = None

    def json(self) -> dict:
        return json.loads(self.data)


@dataclass
class Response:
    status: int
    headers: Dict[str, str]
    body: bytes = b""


@dataclass
class SseClient:
    """One request; ``events()`` yields events as they complete."""

    port: int
    path: str
    headers: Dict[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    http10: bool = False

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        version = "HTTP/1.0" if self.http10 else "HTTP/1.1"
        lines = [f"GET {self.path} {version}", "Host: 127.0.0.1", "Accept: text/event-stream"]
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._raw = b""
        self._text = b""
        self._eof = False
        self.comments = 0
        self.last_id: Optional[str] = None  # what an EventSource would send as Last-Event-ID
        self.id_only = 0  # events with an id: and no data (not dispatched)
        self.response = self._read_head()
        self.chunked = self.response.headers.get("transfer-encoding", "").lower() == "chunked"
        self._pending = Event()

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self.sock.recv(65536)
        if not data:
            self._eof = True
            return False
        self._raw += data
        return True

    def _read_head(self) -> Response:
        while b"\r\n\r\n" not in self._raw:
            if not self._fill():
                raise ConnectionError("closed before the response head")
        head, self._raw = self._raw.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        response = Response(int(status_line.split()[1]), headers)
        if "content-length" in headers:
            while len(self._raw) < int(headers["content-length"]):
                if not self._fill():
                    break
            response.body = self._raw[: int(headers["content-length"])]
        return response

    def _decode(self) -> None:
        """Move whole chunks (or everything, without chunking) from the raw bytes to the event text."""
        if not self.chunked:
            self._text += self._raw
            self._raw = b""
            return
        while True:
            line_end = self._raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self._raw[:line_end].split(b";")[0], 16)
            if size == 0:
                self.ended = True
                return
            if len(self._raw) < line_end + 2 + size + 2:
                return
            self._text += self._raw[line_end + 2 : line_end + 2 + size]
            self._raw = self._raw[line_end + 2 + size + 2 :]

    ended = False

    def next_event(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next complete event, or None when the stream ended."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            self._decode()
            event = self._parse_one()
            if event is not None:
                return event
            if self.ended or self._eof:
                return None
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self._fill():
                    self._decode()
                    continue
            except socket.timeout:
                raise TimeoutError("no event in time") from None
            self._decode()

    def _parse_one(self) -> Optional[Event]:
        while True:
            line_end = self._text.find(b"\n")
            if line_end < 0:
                return None
            line = self._text[:line_end].decode("utf-8")
            self._text = self._text[line_end + 1 :]
            if line == "":
                event, self._pending = self._pending, Event()
                if event.id is not None:
                    self.last_id = event.id
                if event.data or event.name != "message":
                    return event
                if event.id is not None:
                    self.id_only += 1
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                self._pending.data += value
            elif name == "event":
                self._pending.name = value
            elif name == "id":
                self._pending.id = value
            elif name == "retry":
                self._pending.retry = int(value)

    def events(self, count: int, timeout: Optional[float] = None) -> List[Event]:
        got = []
        for _ in range(count):
            event = self.next_event(timeout)
            if event is None:
                break
            got.append(event)
        return got

    def close(self) -> None:
        """Drop the connection at once (an RST, whatever was in flight)."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.sock.close()

    def __enter__(self) -> SseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
