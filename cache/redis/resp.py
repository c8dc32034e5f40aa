"""The Redis wire protocol of the gateway's links: whole replies, lean batches.

txredisapi's protocol costs a lot per command on the read path: a line
parser that pauses for a ``callLater(0)`` after every bulk string followed
by more data, and, per command, a slot in a DeferredQueue, three Deferreds
and a reply-timeout ``callLater`` that is set and cancelled again.
``FastRedisProtocol`` keeps txredisapi's connection handling (AUTH and
SELECT on connect, the pool, the reconnecting factory) and replaces the
request path:

- ``send(commands)`` writes a batch of commands at once and fires one
  Deferred with their replies in order; error replies come back as
  ``ResponseError`` values, so the caller decides what fails;
- replies are read straight into the connection's ``ReplyBuffer`` and
  parsed there, so each value is copied once;
- ``parse_reply`` parses every complete reply in the buffer in one pass,
  with the values txredisapi gives when ``charset=None`` and
  ``convertNumbers=False``: bulk strings as ``bytes``, status replies as
  ``str``, errors as ``ResponseError``;
- one timer per connection keeps the reply deadline: armed for the oldest
  batch still waiting and re-armed lazily, not set and cancelled per command;
- the batches of one pass of the reactor leave in one write, which Redis
  reads in one go: on the workers' reactor (``before_each_wait``,
  ``api.event_loop``) straight from the socket as the pass ends, before
  the reactor waits again; elsewhere through the transport's queue, at the
  next pass. One sent ``sent_at_once`` leaves at once, so Redis works on it
  while the worker goes on.

txredisapi's own command methods (AUTH, SELECT, ROLE) call
``execute_command``, which goes through ``send`` too, so replies keep their
order. MULTI/EXEC and txredisapi's pipelining mode are not supported:
Jetway uses Lua scripts and ``send`` instead.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from typing import Any, Deque, Iterator, List, Optional, Sequence, Tuple, Union

import txredisapi
from twisted.internet import defer, main, reactor, tcp

from cache.redis.reply_buffer import ReplyBuffer
from cache.twisted_internals import read_failed, send_at_once, take_over_reads

_CRLF = b"\r\n"


class Incomplete(Exception):
    """The buffer ends inside a reply; wait for more data."""


class _AtOnce:
    """Whether the batches sent now go to Redis's socket at once (``sent_at_once``)."""

    active = False


@contextlib.contextmanager
def sent_at_once() -> Iterator[None]:
    """The batches sent inside go to Redis's socket at once, not at the reactor's next pass.

    For a reader that has work of its own to do before it returns to the
    reactor (an export makes a page into lines while its next page is read).
    Not for every command: a request's command waits for the pass, where one
    write carries every command of that pass's requests; sent each at once,
    a cache-miss read cost Redis several times the CPU (docs/performance.md,
    "Import and export").
    """
    was = _AtOnce.active
    _AtOnce.active = True
    try:
        yield
    finally:
        _AtOnce.active = was


def parse_reply(buffer: Union[bytes, bytearray], pos: int, end: Optional[int] = None) -> Tuple[Any, int]:
    """The reply starting at ``pos`` in ``buffer[:end]`` and the position after it.

    Bulk strings come back as ``bytes`` copies, which later reads into
    ``buffer`` (a connection's ``ReplyBuffer``) leave alone.
    """
    if end is None:
        end = len(buffer)
    line_end = buffer.find(_CRLF, pos, end)
    if line_end < 0:
        raise Incomplete()
    kind = buffer[pos]
    line = buffer[pos + 1 : line_end]
    pos = line_end + 2
    if kind == 36:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, pos
        if end < pos + size + 2:
            raise Incomplete()
        return memoryview(buffer)[pos : pos + size].tobytes(), pos + size + 2
    if kind == 42:  # * array
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            item, pos = parse_reply(buffer, pos, end)
            items.append(item)
        return items, pos
    if kind == 58:  # : integer
        return int(line), pos
    if kind == 43:  # + status
        return line.decode(), pos
    if kind == 45:  # - error
        return txredisapi.ResponseError(line.decode(errors="replace")), pos
    raise txredisapi.InvalidResponse(f"unknown reply type {chr(kind)!r}")


# What ``ReplyReader.next_reply`` gives while the reply it reads is not whole yet.
PENDING: Any = object()


class ReplyReader:
    """Whole replies out of a connection's buffer; an array that spans reads resumes where it stopped.

    ``parse_reply`` starts a reply over at every read that does not finish
    it, copying each of its finished elements again: a reply of many large
    strings cost time quadratic in its size. A reply that arrives whole (the
    usual one) is parsed by ``parse_reply`` as before; an array that does
    not is opened here, its finished elements are kept and their bytes may
    be dropped from the buffer (the position returned is past them), and
    the next read goes on from the element it stopped in.
    """

    __slots__ = ("_open",)

    def __init__(self) -> None:
        # The arrays begun and not finished, outermost first: [items so far, items expected].
        self._open: List[List[Any]] = []

    def reset(self) -> None:
        self._open = []

    def next_reply(self, buffer: Union[bytes, bytearray], pos: int, end: int) -> Tuple[Any, int]:
        """The next whole reply from ``pos`` and the position after it; or ``PENDING`` and how far it read."""
        if not self._open:
            try:
                return parse_reply(buffer, pos, end)
            except Incomplete:
                if buffer[pos] != 42:  # not an array: nothing of it can be kept
                    return PENDING, pos
        return self._resume(buffer, pos, end)

    def _resume(self, buffer: Union[bytes, bytearray], pos: int, end: int) -> Tuple[Any, int]:
        arrays = self._open
        while True:
            if arrays and len(arrays[-1][0]) == arrays[-1][1]:
                value = arrays.pop()[0]
            elif pos >= end:
                return PENDING, pos
            elif buffer[pos] == 42:  # * an array: open it, unless it is empty or null
                line_end = buffer.find(_CRLF, pos, end)
                if line_end < 0:
                    return PENDING, pos
                count = int(buffer[pos + 1 : line_end])
                pos = line_end + 2
                if count > 0:
                    arrays.append([[], count])
                    continue
                value = None if count < 0 else []
            else:
                try:
                    value, pos = parse_reply(buffer, pos, end)
                except Incomplete:
                    return PENDING, pos
            if not arrays:
                return value, pos
            arrays[-1][0].append(value)


# The heads of short arrays and bulk strings, made once, without their line ends: the parts of a command are
# joined by CRLF (``encode_commands``). A write's EVALSHA has ~20 arguments, a batch's thousands, and formatting
# each head (``b"$%d\r\n%s\r\n"``) cost PyPy more than joining ready heads (docs/history/performance.md, "The
# changes, in the order done").
_ARRAY_HEADS = tuple(b"*%d" % count for count in range(64))
_BULK_HEADS = tuple(b"$%d" % size for size in range(1024))


def encode_command(command: Sequence[Any]) -> bytes:
    """One command as a RESP array of bulk strings."""
    return encode_commands((command,))


def encode_commands(commands: Sequence[Sequence[Any]]) -> bytes:
    """Commands as RESP arrays of bulk strings, one after another, in one ``bytes``.

    Every head and value is a part of one list made at its final size, joined
    once by CRLF (a last empty part ends the last value): two parts an
    argument, and no list grown or bytes joined per command. On PyPy a
    batch's ``WRITE_MANY`` of thousands of arguments took a third of the
    time it did with three parts an argument appended to a growing list
    (docs/history/performance.md, "Commands encoded in one join").
    """
    total = 1
    for command in commands:
        total += 1 + 2 * len(command)
    parts = [b""] * total
    at = 0
    for command in commands:
        count = len(command)
        parts[at] = _ARRAY_HEADS[count] if count < len(_ARRAY_HEADS) else b"*%d" % count
        at += 1
        for arg in command:
            value = arg if type(arg) is bytes else _as_bytes(arg)
            size = len(value)
            parts[at] = _BULK_HEADS[size] if size < len(_BULK_HEADS) else b"$%d" % size
            parts[at + 1] = value
            at += 2
    return b"\r\n".join(parts)


# Small counts as bytes, made once: a batch's WRITE_MANY carries one for each of its writes.
_SMALL_INTS = tuple(b"%d" % number for number in range(1024))


def _as_bytes(arg: Any) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, int) and not isinstance(arg, bool):
        return _SMALL_INTS[arg] if 0 <= arg < len(_SMALL_INTS) else b"%d" % arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, float):
        return format(arg, "f").encode()  # as txredisapi sends a float
    raise TypeError(f"a Redis argument must be bytes, str, int or float, not {type(arg).__name__}")


class _PassWrites:
    """The connections given commands during a pass of the reactor, each sent in one write as the pass ends.

    Twisted's own ``transport.write`` queues the bytes and asks epoll to say
    when the socket is writable, so a command leaves one poll later, after
    two ``epoll_ctl`` calls and a pass through the transport's ``doWrite``.
    Sent straight from the socket before the reactor waits, the commands of
    every request of the pass still go in one write, and those costs are
    gone; what the socket does not take is queued as before.
    """

    def __init__(self) -> None:
        self.waiting: List[FastRedisProtocol] = []
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()

    def on(self, clock: Any) -> Optional[_PassWrites]:
        """This, once ``clock`` calls it before each wait (it has ``before_each_wait``); None for another reactor."""
        before_each_wait = getattr(clock, "before_each_wait", None)
        if before_each_wait is None:
            return None
        if clock not in self._hooked:
            self._hooked.add(clock)
            before_each_wait(self.send_all)
        return self

    def send_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for protocol in waiting:
            protocol.send_unsent()


_PASS_WRITES = _PassWrites()


class _Batch:
    """Commands written together, waiting for their replies."""

    __slots__ = ("deadline", "deferred", "expected", "replies")

    def __init__(self, expected: int, deadline: float) -> None:
        self.deferred: defer.Deferred = defer.Deferred()
        self.expected = expected
        # Made when the first reply comes, not now: see _reply_received.
        self.replies: Optional[List[Any]] = None
        self.deadline = deadline


class FastRedisProtocol(txredisapi.RedisProtocol):
    """txredisapi's protocol with ``send`` and ``parse_reply`` as its request path."""

    # The reactor the reply deadline is kept on (txredisapi's own timers use
    # the global reactor too).
    clock: Any = reactor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inbox = ReplyBuffer()
        self._reader = ReplyReader()
        self._batches: Deque[_Batch] = deque()
        self._deadline_check: Optional[Any] = None
        # Commands of this pass not written yet, and where they wait (None: through the transport's queue).
        self._unsent: List[bytes] = []
        self._pass: Optional[_PassWrites] = None

    def connectionMade(self) -> Any:
        if isinstance(self.transport, tcp.Connection) and not self.transport.TLS:
            # A plain socket (TCP or unix) reads straight into the reply
            # buffer; a TLS transport's socket feeds its TLS engine, which
            # hands the protocol plain bytes through dataReceived.
            take_over_reads(self.transport, self._read_replies)
            self._pass = _PASS_WRITES.on(self.clock)
        return super().connectionMade()

    @property
    def backlog(self) -> int:
        """Batches sent and not yet answered."""
        return len(self._batches)

    def send(self, commands: Sequence[Sequence[Any]]) -> defer.Deferred:
        """Write ``commands`` at once; fires with their replies, or fails as a whole (lost, timed out)."""
        if not self.connected:
            return defer.fail(txredisapi.ConnectionError("Not connected"))
        if not commands:
            return defer.succeed([])  # a batch awaiting no reply would take the next batch's
        payload = encode_commands(commands)
        timeout = self.replyTimeout or 0
        batch = _Batch(len(commands), self.clock.seconds() + timeout)
        self._batches.append(batch)
        if self._pass is not None and not _AtOnce.active:
            if not self._unsent:
                self._pass.waiting.append(self)
            self._unsent.append(payload)
        else:
            if self._unsent:  # never ahead of commands given before it
                payload = self._take_unsent() + payload
            if _AtOnce.active:
                payload = send_at_once(self.transport, payload)
            if payload:
                self.transport.write(payload)
        if timeout and self._deadline_check is None:
            self._deadline_check = self.clock.callLater(timeout, self._check_deadline)
        return batch.deferred

    def send_unsent(self) -> None:
        """Write the commands this pass gave: straight from the socket, the rest (if any) queued on the transport."""
        if self._unsent:
            rest = send_at_once(self.transport, self._take_unsent())
            if rest:
                self.transport.write(rest)

    def _take_unsent(self) -> bytes:
        payload = b"".join(self._unsent)
        self._unsent = []
        return payload

    def execute_command(self, *args: Any, **kwargs: Any) -> defer.Deferred:
        """txredisapi's entry point for one command, on ``send``."""
        if self.inMulti or self.pipelining:
            raise NotImplementedError("MULTI/EXEC and txredisapi's pipelining are not supported by this protocol")
        result = self.send([args]).addCallback(_only_reply)
        post_proc = kwargs.get("post_proc")
        return result.addCallback(post_proc) if callable(post_proc) else result

    def _read_replies(self) -> Optional[Any]:
        """The socket transport's ``doRead``: Redis's bytes into the reply buffer, then every whole reply."""
        try:
            if not self._inbox.receive(self.transport.socket):
                return main.CONNECTION_DONE
        except OSError as error:
            return read_failed(error)
        self._parse_replies()
        return None

    def dataReceived(self, data: bytes) -> None:
        self._inbox.append(data)
        self._parse_replies()

    def _parse_replies(self) -> None:
        inbox, reader = self._inbox, self._reader
        pos = 0
        while pos < inbox.end:
            try:
                reply, pos = reader.next_reply(inbox.data, pos, inbox.end)
            except (ValueError, IndexError, txredisapi.InvalidResponse) as error:
                # A stream we cannot read is a connection we cannot trust.
                inbox.clear()
                reader.reset()
                self._fail_all(txredisapi.InvalidResponse(str(error)))
                self.transport.loseConnection()
                return
            if reply is PENDING:
                break
            self._reply_received(reply)
        inbox.consume(pos)

    def connectionLost(self, why: Any) -> None:
        super().connectionLost(why)
        self._unsent = []  # their batches fail below
        self._inbox.clear()
        self._reader.reset()
        if self._deadline_check is not None and self._deadline_check.active():
            self._deadline_check.cancel()
        self._deadline_check = None
        self._fail_all(txredisapi.ConnectionError("Lost connection"))

    def _reply_received(self, reply: Any) -> None:
        if not self._batches:
            return  # a late reply to a batch already failed; the connection is closing
        # A batch waiting for Redis is usually moved to PyPy's old generation
        # by a minor collection, and an old object that is given a young one
        # keeps it alive through the next minor collection even when both
        # are garbage by then. So the replies go in a list made now, which
        # the batch lets go of before they are handed on: a 10 KB value is
        # not copied to the old generation for nothing.
        batch = self._batches[0]
        replies = batch.replies
        if replies is None:
            replies = [reply]
        else:
            replies.append(reply)
        if len(replies) < batch.expected:
            batch.replies = replies  # the rest come in a later read
            return
        self._batches.popleft()
        batch.replies = None
        if not batch.deferred.called:  # the caller may have cancelled it
            batch.deferred.callback(replies)

    def _check_deadline(self) -> None:
        """Fail everything if the oldest batch is overdue, else look again when it would be."""
        self._deadline_check = None
        if not self._batches:
            return
        late = self._batches[0].deadline - self.clock.seconds()
        if late > 0:
            self._deadline_check = self.clock.callLater(late, self._check_deadline)
            return
        # The replies still to come would be matched to the wrong batches
        # once one is given up on: the connection goes with them.
        self._fail_all(txredisapi.TimeoutError(f"Not received Redis response in {self.replyTimeout} seconds"))
        self.transport.abortConnection()

    def _fail_all(self, error: Exception) -> None:
        batches, self._batches = self._batches, deque()
        for batch in batches:
            if not batch.deferred.called:
                batch.deferred.errback(error)


def _only_reply(replies: List[Any]) -> Any:
    reply = replies[0]
    if isinstance(reply, Exception):
        raise reply
    return reply
