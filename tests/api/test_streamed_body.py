"""api.streamed_body: a body handed to its handler as it arrives, held to its deadline; an answer's drain."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from twisted.internet import task

from api.connection import HttpLimits
from api.deadline import ABORT
from api.request_head import parse_head
from api.streamed_body import STREAM_HOLD, Drain, StreamedBody
from handlers.http.body_stream import BodyLost


class Deadline:
    """The connection's deadline, recording what is armed."""

    def __init__(self) -> None:
        self.armed: Optional[Tuple[float, Optional[int]]] = None

    def arm(self, seconds: float, action: Optional[int]) -> None:
        self.armed = (seconds, action)

    def disarm(self) -> None:
        self.armed = None


class Reading:
    """The connection's reading: paused or not."""

    def __init__(self) -> None:
        self.calls: List[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


def streamed(head: bytes) -> Tuple[StreamedBody, Deadline, Reading, Any]:
    """A streamed body of the request whose head is ``head``; its deadline, its reading and its clock."""
    clock = task.Clock()
    deadline, reading = Deadline(), Reading()
    body = StreamedBody(parse_head(head), HttpLimits(), clock, deadline, reading.pause, reading.resume)  # type: ignore[arg-type]
    return body, deadline, reading, clock


def test_a_body_is_taken_from_the_buffer_up_to_its_length_and_ends_whole():
    body, deadline, _, _ = streamed(b"POST /v1/_import/c HTTP/1.1\r\nHost: h\r\nContent-Length: 6")
    buffer = bytearray(b"abc")
    assert not body.take(buffer) and buffer == b""
    assert deadline.armed == (30.0, 408)
    buffer += b"defGET / HTTP/1.1\r\n"
    assert body.take(buffer)
    assert buffer == b"GET / HTTP/1.1\r\n"  # the next request is left for the connection
    body.finish()
    assert body.stream.complete and deadline.armed is None and body.ended


def test_a_full_stream_pauses_reading_and_stops_the_clock_until_its_handler_takes_it():
    body, deadline, reading, clock = streamed(b"POST /v1/_import/c HTTP/1.1\r\nHost: h\r\nContent-Length: 999999")
    assert not body.take(bytearray(b"x" * STREAM_HOLD))
    assert reading.calls == ["pause"] and deadline.armed is None
    clock.advance(100)  # the handler held it up: not the client's time
    body.stream.read()
    assert reading.calls == ["pause", "resume"]
    assert deadline.armed is not None and deadline.armed[0] > 29


def test_a_failed_body_fails_its_handlers_read_and_its_room_no_longer_reads_on():
    body, _, reading, _ = streamed(b"POST /v1/_import/c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked")
    assert not body.take(bytearray(b"3\r\nabc\r\n"))
    body.fail(BodyLost("gone"))
    assert body.ended and isinstance(body.stream.error, BodyLost)
    body.stream.read()
    assert reading.calls == []


def test_a_drain_fires_at_once_when_nothing_waits_and_else_when_the_output_is_sent():
    deadline = Deadline()
    drain = Drain(deadline, 30.0)  # type: ignore[arg-type]
    fired: List[bool] = []
    drain.wait(lost=False, blocked=False).addCallback(fired.append)
    drain.wait(lost=True, blocked=True).addCallback(fired.append)
    assert fired == [True, False]
    drain.wait(lost=False, blocked=True).addCallback(fired.append)
    assert deadline.armed == (30.0, ABORT)
    drain.fire(True)
    assert fired == [True, False, True] and deadline.armed is None
