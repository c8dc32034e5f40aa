"""The connection's streamed bodies and streamed answers (``api.connection`` mixes this in).

One route takes its body as it arrives, not whole: the NDJSON import
(``handlers.paths.IMPORT``, ``handlers.imports``). Its request is
dispatched at its head; what the socket brings is handed to the request's
``BodyStream`` (``handlers.http.body_stream``), and the connection stops
reading while the stream is full, so the input it holds is bounded
whatever the body's size. The body timeout counts from the last byte that
arrived (a slow but steady upload goes on; an idle one gets its 408),
and not while the handler is the one holding the body up. A request
answered before its body ended closes the connection.

A handler that streams its answer (the NDJSON export, ``handlers.exports``)
writes a part, then waits for ``when_drained`` before making the next.

Every attribute used here is the connection's (``JetwayConnection``).
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

from twisted.internet import defer

from api.chunked import ChunkedDecoder
from api.request_head import ProtocolError, RequestHead
from handlers.http.body_stream import BodyStream
from handlers.http.errors import ApiError
from handlers.paths import IMPORT as IMPORT_PATH

# What a streamed body holds before the connection stops reading: the
# handler's line splitter holds at most a line more (max_body).
STREAM_HOLD = 64 * 1024
STREAMED_PREFIX = IMPORT_PATH.partition("{")[0]


def streams(head: RequestHead) -> bool:
    """Whether the request's body goes to its handler as it arrives (an import's)."""
    return head.has_body and head.method == "POST" and head.target.startswith(STREAMED_PREFIX)


class StreamedBody:
    """The connection's part that streams a body in, or an answer out."""

    _stream: Optional[BodyStream]
    _drained: Optional[defer.Deferred]
    _chunks: Optional[ChunkedDecoder]
    _stream_left: int
    _stream_keep_alive: bool
    _buffer: bytearray
    _lost: bool
    _output_blocked: bool
    _request: Any
    transport: Any
    limits: Any
    keep_alive: bool

    def when_drained(self) -> defer.Deferred:
        """Fires True once the output queued now is sent (at once if none is), False if the connection is lost.

        For a handler that streams its answer: it writes a part, then waits
        for this before making the next, so the worker holds about one part
        per client however slowly it reads (Twisted pauses the connection,
        the transport's producer, past ``READ_SIZE`` queued, and resumes it
        once all of it is sent). A client that takes nothing for the send
        timeout is aborted (then this fires False).
        """
        if self._lost:
            return defer.succeed(False)
        if not self._output_blocked:
            return defer.succeed(True)
        self._arm_send_abort()
        self._drained = defer.Deferred()
        return self._drained

    def _fire_drained(self, sent: bool) -> None:
        drained, self._drained = self._drained, None
        if drained is not None:
            if sent:
                self._disarm()
            drained.callback(sent)

    def _start_stream(self, head: RequestHead) -> None:
        """Dispatch an import at its head: its body goes to the handler as it arrives (``BodyStream``).

        The worker's body budget holds what the stream and the handler's
        line splitter may hold, not the body's size, which is unbounded.
        """
        self._reserve_body(2 * STREAM_HOLD + self.limits.max_body)
        self._chunks = ChunkedDecoder(sys.maxsize) if head.chunked else None
        self._stream_left = head.content_length
        self._stream = BodyStream(STREAM_HOLD, self._stream_room)
        if head.expects_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._dispatch(head, b"", self._stream)
        if self._stream is not None:
            self._feed_stream()

    def _feed_stream(self) -> None:
        """Hand the stream what the buffer holds of its body; stop reading while it is full."""
        stream = self._stream
        assert stream is not None and self._request is not None
        try:
            data, done = self._stream_data()
        except ProtocolError as error:
            self._end_stream(ApiError(error.status, error.problem, error.detail))
            return
        if data:
            self._arm(self.limits.body_timeout, 408)  # steady progress keeps a slow upload going
            stream.feed(data)  # the handler may answer in there, ending the stream
        if self._stream is not stream:
            return
        if done:
            self._stream = self._chunks = None
            self.keep_alive = self._stream_keep_alive
            self._disarm()
            self.transport.pauseProducing()  # what follows is the next request: it waits for this answer
            stream.finish()
        elif not stream.has_room():
            self._disarm()  # the handler holds the body up, not the client
            self.transport.pauseProducing()

    def _stream_data(self) -> Tuple[bytes, bool]:
        """What the buffer holds of the streamed body, taken from it; and whether the body ended."""
        if self._chunks is not None:
            done = self._chunks.feed(self._buffer)
            return self._chunks.take(), done
        size = min(self._stream_left, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._stream_left -= size
        return data, not self._stream_left

    def _stream_room(self) -> None:
        """The handler took what the stream held: read on."""
        if self._stream is None or self._lost:
            return
        self._arm(self.limits.body_timeout, 408)
        if not self._output_blocked:
            self.transport.resumeProducing()

    def _end_stream(self, error: Exception) -> None:
        """The streamed body will not arrive whole: its handler's next read raises ``error``."""
        stream, self._stream, self._chunks = self._stream, None, None
        if stream is not None:
            self._buffer = bytearray()
            stream.fail(error)
