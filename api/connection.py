"""Jetway's HTTP/1.1 connection: Cyclone's, with a hardened front door.

Cyclone's own connection reads chunked bodies as empty (so the chunks are
parsed as the next request), trusts any ``Content-Length``, has no limits
on headers nor any timeout, and loses a response when two pipelined requests
overlap. This subclass replaces how requests are read and keeps the rest of
Cyclone (``HTTPRequest``, handlers, writing responses):

- the head is parsed strictly (``api.request_head``); a body over the limit
  is refused from its announced length, before it is read, and a body that
  does not fit the worker's budget (``api.body_budget``) with 503;
- one request at a time, with back-pressure both ways: bytes that arrive
  while a request is answered pause reading until the buffer holds no
  complete request (so the input held is at most one read beyond a partial
  request), and a response the client does not read (the transport queues
  it: the connection is its producer) stops the next pipelined request and
  all reading until it is sent;
- a header timeout counted from the first byte of a request (trickling
  bytes do not reset it), a body timeout, an idle keep-alive timeout, and a
  send timeout (queued output that makes no progress for that long aborts
  the connection), all checked by one sweep of the open connections every
  quarter second (``api.application``);
- the client address comes from ``X-Forwarded-For`` only when the peer is a
  trusted proxy (``api.client_address``).

docs/operations.md, "Hostile clients", states what this bounds a connection's memory to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import cyclone.httpserver
from cyclone.httputil import HTTPHeaders
from twisted.internet import defer
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from api.body_budget import Reservation
from api.chunked import ChunkedDecoder
from api.client_address import Network, client_address
from api.deadline import ABORT, CLOSE, Deadline
from api.debug_burn import burn_cpu
from api.drain import linger
from api.refusal import refusal
from api.request_head import MAX_HEADER_BYTES, MAX_REQUEST_LINE, ProtocolError, RepeatedHeads, RequestHead
from api.routed import Routed
from api.streamed_body import STREAM_TIMEOUT_DETAIL, Drain, StreamedBody, stream_reservation
from handlers.framework import CycloneConnection
from handlers.http.body_stream import BodyLost, BodyStream
from handlers.http.deferreds import is_deferred
from handlers.http.errors import ApiError
from handlers.http.reply import Reply
from handlers.operation import BATCH_BODY, STREAMED_BODY
from handlers.pipeline import Exchange, failed, start

# Everything a head may hold, plus its blank line: more is a 431 or a 414.
_MAX_HEAD = MAX_REQUEST_LINE + MAX_HEADER_BYTES + 4
# Bytes asked of the socket per read. Twisted asks for 64 KiB while a
# request is typically under 1 KiB, and on PyPy every read allocates a
# buffer of the size asked: at 64 KiB those buffers were about a third of
# what a document read allocates (one worker, PyPy's GC hooks counting minor
# collections per request: 0.154 at 64 KiB, 0.103 at 8 KiB). TCP clients
# now read into the process's shared buffer (api.eager_send), which
# allocates only what came; this size is for the others (a unix socket).
# It is also the transport's high-water mark: a response it cannot hand to
# the kernel whole pauses the connection (Twisted's ``bufferSize``).
READ_SIZE = 8192
# How long a client should wait before sending a body again when the
# worker's body budget is spent.
BUSY_RETRY_AFTER = "1"

_log = Logger()


# What the connection's request is while a pipeline it runs waits (for
# Redis): no Cyclone request, but one being answered.
_AWAITING_REDIS: Any = object()


@dataclass(frozen=True)
class HttpLimits:
    max_body: int = 1024 * 1024
    max_batch_body: int = 8 * 1024 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    body_min_rate: int = 500  # bytes/s a streamed body must average (api.streamed_body.StreamClock)
    keepalive_timeout: float = 75.0
    send_timeout: float = 30.0
    body_budget: int = 64 * 1024 * 1024
    max_connections: int = 10000
    trusted_proxies: Tuple[Network, ...] = ()


class JetwayConnection(CycloneConnection):
    """One client connection; registered with the application while open."""

    # The api.application.JetwayApplication that made it (not imported: that module imports this one).
    factory: Any

    def connectionMade(self) -> None:
        super().connectionMade()
        self.transport.bufferSize = READ_SIZE
        self.transport.registerProducer(self, True)
        self.limits = self.factory.limits
        self.closing = False  # the worker drains (api.drain): answers say Connection: close
        self.asked = False  # a request came: until then, one is on its way (api.drain)
        self.lingering = False  # closed for writing, dropping what the client still sends (close)
        self.keep_alive = True
        self._buffer = bytearray()
        # The bytes of the read that filled an empty buffer, while the buffer holds just them (``_read_head``).
        self._fresh: Optional[bytes] = None
        self._head: Optional[RequestHead] = None
        self._heads = RepeatedHeads()  # its last head, parsed: the next is most often the same bytes
        self._routed: Optional[Routed] = None  # the route of the request whose head was read
        self._chunks: Optional[ChunkedDecoder] = None
        self._streamed: Optional[StreamedBody] = None  # a streamed body still arriving (api.streamed_body)
        # When the connection times out, and what it does then; the application's sweep checks it.
        self._deadline = Deadline(self.factory.clock, self.transport)
        self._drain = Drain(self._deadline, self.limits.send_timeout)  # a streamed answer's wait (when_drained)
        self._processing = False
        self._output_blocked = False
        self._lost = False
        self._reserved = Reservation(self.factory.body_budget)  # what the request's body holds of the worker's budget
        self.idle_since = self.factory.clock.seconds()
        # The peer's address, asked of the transport once (it builds a new address object per call).
        self._peer_host: str = getattr(self.transport.getPeer(), "host", "unix")
        self._deadline.arm(self.limits.keepalive_timeout, CLOSE)
        self.factory.connection_opened(self)

    def connectionLost(self, reason: Any) -> None:
        self._lost = True
        self._deadline.disarm()
        self._end_stream(BodyLost("the connection closed"))
        self._drop_input()
        self.factory.connection_closed(self)
        super().connectionLost(reason)
        self._drain.fire(False)  # last: a streamed answer's handler finishes in there

    def busy(self) -> bool:
        """A request is being received or answered on this connection."""
        return self.current_request is not None or bool(self._buffer) or self._head is not None

    # The transport's producer (IPushProducer): it pauses the connection
    # when it queues output the kernel did not take, resumes it when all of
    # that is sent, and stops it when the connection is lost.

    def pauseProducing(self) -> None:
        self._output_blocked = True
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self._output_blocked = False
        if self.current_request is None and not self._lost:
            self._await_next()
        self._drain.fire(True)

    def stopProducing(self) -> None:
        self._drop_input()

    def dataReceived(self, data: bytes) -> None:
        if self.lingering:
            return  # never a request that can be answered (close)
        if not self.busy():
            # The first byte of a request starts its header clock; later
            # bytes do not reset it.
            self._deadline.arm(self.limits.header_timeout, 408)
        # Only while a head is awaited: a body's chunks are not held twice.
        self._fresh = data if not self._buffer and self._head is None and self._streamed is None else None
        self._buffer += data
        if self._streamed is not None:
            self._feed_stream(self._streamed)
            return
        if self.current_request is not None:
            # A pipelined request: it waits in the buffer, and nothing more
            # is read until the buffer holds no complete request.
            self.transport.pauseProducing()
            return
        self._process()

    def _await_next(self) -> None:
        """Between requests: wait for the client to read, or serve what is buffered, or read on."""
        if self._output_blocked:
            self._arm_send_abort()
            return
        if self._buffer:
            self._deadline.arm(self.limits.header_timeout, 408)
            self._process()
        else:
            self._deadline.arm(self.limits.keepalive_timeout, CLOSE)
        if self.current_request is None and not self._output_blocked:
            self.transport.resumeProducing()

    def _process(self) -> None:
        if self._processing:
            return  # a handler finished inside the loop below; it goes on
        self._processing = True
        try:
            while self._can_start_request() and self._next_request():
                pass
        except ProtocolError as error:
            self._reject(error)
        finally:
            self._processing = False

    def _can_start_request(self) -> bool:
        return (
            self.current_request is None
            and not self._output_blocked
            and not self._lost
            and not self.transport.disconnecting
        )

    def _next_request(self) -> bool:
        """Read on from the buffer; True when a request was dispatched."""
        if self._head is None:
            self._head = self._read_head()
            if self._head is None:
                return False
            # Routed once, at its head: its operation says how its body is read (api.application.route).
            self._routed = self.factory.route_request(self._head.method, self._head.target)
            intake = self._routed.intake
            if intake == STREAMED_BODY and self._head.has_body:
                self._start_stream(self._head, self._routed)
                return True
            self._expect_body(self._head, self.limits.max_batch_body if intake == BATCH_BODY else self.limits.max_body)
        body = self._read_body(self._head)
        if body is None:
            return False
        self._dispatch(self._head, body, self._routed)
        return True

    def _read_head(self) -> Optional[RequestHead]:
        fresh, self._fresh = self._fresh, None
        # Nothing taken or added since that read, and no blank lines before the head (RFC 9112 2.2: below).
        if fresh is not None and len(fresh) == len(self._buffer) and not fresh.startswith(b"\r\n"):
            # Searched as bytes, which PyPy does much faster than a bytearray (docs/identity.md).
            found = self._heads.head_in(fresh)
            if found is not None:
                del self._buffer[: found[1]]
                return found[0]
        while self._buffer.startswith(b"\r\n"):  # RFC 9112 2.2: ignore blank lines first
            del self._buffer[:2]
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            end = len(self._buffer)
            if self._buffer.find(b"\r\n", 0, MAX_REQUEST_LINE + 2) < 0 and end > MAX_REQUEST_LINE:
                raise ProtocolError(414, "the request line is too long")
            if end > _MAX_HEAD:
                raise ProtocolError(431, "the request head is too large")
            return None
        block = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        return self._heads.parse(block)

    def _expect_body(self, head: RequestHead, limit: int) -> None:
        if not head.has_body:
            return
        if head.content_length > limit:
            raise ProtocolError(413, f"the body is larger than {limit} bytes")
        if head.chunked:
            self._chunks = ChunkedDecoder(limit)
        self._reserve_body(head.content_length)
        self._deadline.arm(self.limits.body_timeout, 408)
        if head.expects_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _read_body(self, head: RequestHead) -> Optional[bytes]:
        if self._chunks is not None:
            done = self._chunks.feed(self._buffer)
            # A chunked body reserves the chunk sizes it has announced.
            self._reserve_body(self._chunks.announced)
            if not done:
                return None
            body, self._chunks = self._chunks.body, None
            return body
        if len(self._buffer) < head.content_length:
            return None
        with memoryview(self._buffer) as view:
            body = bytes(view[: head.content_length])  # one copy (a slice of the bytearray was a second, 8 MiB at most)
        del self._buffer[: head.content_length]
        return body

    def _reserve_body(self, size: int, streamed: bool = False) -> None:
        """Hold ``size`` bytes of the worker's body budget for this request's body (a streamed one: of its share)."""
        if not self._reserved.grow(size, streamed):
            raise ProtocolError(
                503, "the server is receiving too many request bodies; retry shortly", {"Retry-After": BUSY_RETRY_AFTER}
            )

    def _drop_input(self) -> None:
        """Forget what the client sent and no request took: it will never be answered."""
        self._buffer = bytearray()
        self._head = self._chunks = None
        self._reserved.release()

    def _dispatch(self, head: RequestHead, body: bytes, routed: Routed, stream: Optional[BodyStream] = None) -> None:
        self._deadline.disarm()
        self._head = None
        self.asked = True
        # A streamed body's request answered before its body ended closes the connection.
        self.keep_alive = head.keep_alive and stream is None
        app = self.factory
        if app.debug_burn_seconds:
            burn_cpu(app.debug_burn_seconds)
        pipeline = routed.pipeline if self._answers(head) else None
        if pipeline is None:
            self._start_request(head, body, routed, stream)
            return
        spec = routed.spec
        exchange = app.exchange(head.method, routed, head.headers, body)
        route = spec.handler_class.ROUTE  # type: ignore[union-attr]  # a pipeline has a route
        started = time.time()
        reply = start(pipeline, exchange)
        if is_deferred(reply):
            # It waits (for Redis): this connection waits as it would for a handler.
            self.current_request = _AWAITING_REDIS
            more = (exchange, head, route, started)
            reply.addCallbacks(self._send_reply, self._send_problem, callbackArgs=more, errbackArgs=more)
        else:
            self._send_reply(reply, exchange, head, route, started)

    def _start_request(self, head: RequestHead, body: bytes, routed: Routed, stream: Optional[BodyStream]) -> None:
        """Hand the request to Cyclone, with its route: it is not routed again."""
        request = cyclone.httpserver.HTTPRequest(
            connection=self,
            method=head.method,
            uri=head.target,
            version=head.version,
            headers=head.headers,
            body=body,
            remote_ip=self._client_address(head.headers),
        )
        request.routed = routed
        if stream is not None:
            request.body_stream = stream
        self.current_request = request
        self.request_callback(request)

    def _start_stream(self, head: RequestHead, routed: Routed) -> None:
        """Dispatch an import at its head: its body goes to the handler as it arrives (``api.streamed_body``).

        The worker's body budget holds what the stream and the handler's
        line splitter may hold, not the body's size, which is unbounded.
        """
        self._reserve_body(stream_reservation(self.limits.max_body), streamed=True)
        pause = self.transport.pauseProducing
        body = StreamedBody(head, self.limits, self.factory.clock, self._deadline, pause, self._read_on)
        self._streamed = body
        if head.expects_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._dispatch(head, b"", routed, body.stream)
        if self._streamed is body:
            self._feed_stream(body)

    def _feed_stream(self, body: StreamedBody) -> None:
        """Hand the streamed body what the buffer holds of it; once it ended, what follows is the next request."""
        assert self.current_request is not None
        try:
            ended = body.take(self._buffer)
        except ProtocolError as error:
            self._end_stream(ApiError(error.status, error.problem, error.detail))
            return
        if ended:
            self._streamed = None
            self.keep_alive = body.keep_alive
            body.finish()

    def _read_on(self) -> None:
        """A streamed body's handler took what it held: read on, unless the client is not taking the output."""
        if not self._output_blocked:
            self.transport.resumeProducing()

    def _end_stream(self, error: Exception) -> None:
        """The streamed body will not arrive whole: its handler's next read raises ``error``."""
        body, self._streamed = self._streamed, None
        if body is not None:
            self._buffer = bytearray()  # the rest of its body: never a request
            body.fail(error)

    def when_drained(self) -> defer.Deferred:
        """Fires True once the output queued now is sent, False if the connection is lost (``api.streamed_body.Drain``).

        For a handler that streams its answer (the NDJSON export).
        """
        return self._drain.wait(self._lost, self._output_blocked)

    def _answers(self, head: RequestHead) -> bool:
        """Whether this connection runs an operation's pipeline itself (``handlers.pipeline``), not Cyclone.

        Only for a request on a connection that stays open after it (so its
        head needs no ``Connection`` header but when the worker begins
        draining meanwhile).
        """
        return (
            self.factory.direct_answers
            and head.keep_alive
            and head.version == "HTTP/1.1"
            and not self.closing
            and not self.no_keep_alive
        )

    def _send_problem(
        self, failure: Failure, exchange: Exchange, head: RequestHead, route: str, started: float
    ) -> None:
        """A pipeline's step failed while it waited: send its problem's reply."""
        self._send_reply(failed(failure, exchange), exchange, head, route, started)

    def _send_reply(self, reply: Reply, exchange: Exchange, head: RequestHead, route: str, started: float) -> None:
        """Send a pipeline's reply: its head from the one writer (``handlers.http.reply``), then its body.

        A fault of its own is logged and aborts the connection, rather than
        leave it waiting for an answer that will never come.
        """
        try:
            self._write_reply(reply, exchange, head, route, started)
        except Exception:
            _log.failure("sending a pipeline's reply failed", level=LogLevel.error)
            self.current_request = None
            self.transport.abortConnection()

    def _write_reply(self, reply: Reply, exchange: Exchange, head: RequestHead, route: str, started: float) -> None:
        self.current_request = None
        if self._lost:
            return
        app = self.factory
        cors = app.cors.response_lines(head.headers.get("Origin")) if app.cors.enabled else b""
        closing = "close" if self.closing else None  # the worker began draining while it waited
        response = reply.head("HTTP/1.1", app.http_date(), exchange.request_id, closing, cors, exchange.trace)
        status = reply.status
        self.transport.write(response + reply.body if head.method != "HEAD" and status != 304 else response)
        seconds = time.time() - started
        client = self._client_address(head.headers)
        app.observer.answered_directly(
            route, head.method, head.target, status, client, seconds, exchange.request_id, reply.kind, exchange
        )
        self._next_after_answer()

    def request_answered(self) -> None:
        """Cyclone's handler answered (``handlers.framework.CycloneConnection``): close, or read on."""
        self._next_after_answer()

    def _next_after_answer(self) -> None:
        """A request is answered: close, or go on to the next one."""
        self._end_stream(BodyLost("the request was answered before its body ended"))
        self._reserved.release()
        self.idle_since = self.factory.clock.seconds()
        if self._lost:
            return  # what the client pipelined went with the connection
        if self.no_keep_alive or self.closing or not self.keep_alive:
            self.close()
            return
        self._await_next()

    def close(self) -> None:
        """Close once the queued output is sent; abort if it is not read within the send timeout. While the worker
        drains it lingers instead: no reset then destroys an answer the client has not read (``api.drain``)."""
        # A registered producer would be resumed instead of the connection
        # closed when the output drains (Twisted's doWrite).
        self.transport.unregisterProducer()
        if self.closing and not self._lost:
            self.lingering = True
            self._drop_input()
            linger(self.transport)
        else:
            self.transport.loseConnection()
        self._arm_send_abort()

    def _reject(self, error: ProtocolError) -> None:
        """Answer a request that cannot be served (``api.refusal``), and close."""
        cors = [] if self._head is None else self.factory.cors.response_headers(self._head.headers.get("Origin"))
        self._deadline.disarm()
        self._drop_input()
        self.transport.write(refusal(error, cors))
        self.close()

    def _arm_send_abort(self) -> None:
        self._deadline.arm(self.limits.send_timeout, ABORT)

    def check_deadline(self, now: float) -> None:
        """Time out if the armed deadline has passed (called by the application's sweep; ``api.deadline``)."""
        if self._deadline.passed(now):
            self._expire(self._deadline.action)

    def _expire(self, action: Optional[int]) -> None:
        if self._streamed is not None and action not in (CLOSE, ABORT):
            # A streamed body stalled: its handler answers (what it wrote, then the 408), and the connection closes.
            self.transport.pauseProducing()
            self._end_stream(ApiError(408, "request-timeout", STREAM_TIMEOUT_DETAIL))
        elif action is CLOSE:
            self.close()  # idle keep-alive: close quietly
        elif action == ABORT:
            self.transport.abortConnection()
        else:
            self._reject(ProtocolError(action, "the request did not arrive in time"))

    def _client_address(self, headers: HTTPHeaders) -> str:
        return client_address(self._peer_host, headers.get_list("X-Forwarded-For"), self.limits.trusted_proxies)
