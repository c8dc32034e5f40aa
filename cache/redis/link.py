"""One worker's connection pool to Redis, with deadlines and typed errors.

txredisapi waits forever for a connection while Redis is down; every call
here has a deadline instead, so a request gets a 503 (no connection) or a
504 (no reply) rather than hanging. Replies are raw ``bytes``: no charset
decoding and no number conversion, so a document comes back as stored.
Several commands sent together go down one connection back to back, so they
cost one round trip; and every command goes down the same connection of the
pool while it is up, the others standing by.

``Link`` is the interface the store uses; ``RedisLink`` implements it for one
server, ``cache.redis.sentinel.SentinelLink`` for a master found through Sentinel
and ``cache.redis.cluster.ClusterLink`` for Redis Cluster (``cache.redis.topology``
picks one from the URL).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Set, Tuple, Union

import txredisapi
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, UNIXClientEndpoint
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from cache.redis.address import RedisAddress
from cache.redis.errors import RedisReplyError, RedisTimeout, RedisUnavailable, reply_error
from cache.redis.resp import FastRedisProtocol
from cache.redis.script import Script
from cache.redis.tls import wrap_tls

Arg = Union[bytes, str, int]
Command = Sequence[Arg]
# (True, reply) or (False, the StoreError it failed with), one per command.
Outcome = Tuple[bool, Any]


class Link(Protocol):
    """What the store needs from Redis, whatever the topology behind it."""

    def execute(self, *command: Arg) -> defer.Deferred: ...

    def pipeline(self, commands: Sequence[Command]) -> defer.Deferred: ...

    def pipeline_scripts(self, commands: Sequence[Command], scripts: Sequence[Script]) -> defer.Deferred: ...

    def run_script(self, script: Script, keys: Sequence[bytes], args: Sequence[Arg]) -> defer.Deferred: ...

    def run_script_waiting(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Arg], wait: Command
    ) -> defer.Deferred: ...

    def pipeline_outcomes(
        self, commands: Sequence[Command], scripts: Sequence[Script], wait: Optional[Command] = None
    ) -> defer.Deferred: ...

    def close(self) -> defer.Deferred: ...


class ForgetsLostConnections:
    """Mixed into a pool's factory: a lost connection leaves the pool's queue at once.

    txredisapi's ``delConnection`` takes it out of ``pool`` only; the queue
    kept it until a random ``peek`` happened to land on it. ``RedisLink``
    sends on the queue's first connection, so a lost one must not stay there,
    and lost ones must not pile up behind it as connections come and go.
    """

    connectionQueue: Any

    def delConnection(self, conn: Any) -> None:
        super().delConnection(conn)  # type: ignore[misc]
        if conn in self.connectionQueue.pending:
            self.connectionQueue.remove(conn)


class _Factory(ForgetsLostConnections, txredisapi.RedisFactory):
    # Redis coming back should be noticed within a second or so, not after
    # txredisapi's default back-off of up to 10 s.
    maxDelay = 1.0
    initialDelay = 0.2
    protocol = FastRedisProtocol


class RedisLink:
    """Sends commands to one Redis over a small pool of connections.

    ``spread``: each batch goes down the connection with the fewest batches
    waiting, not always the first. For a pool whose commands may block
    their connection (``WAIT``), so that one slow batch does not hold up
    the rest.
    """

    def __init__(
        self, address: RedisAddress, reactor: Any, timeout: float, poolsize: int = 4, spread: bool = False
    ) -> None:
        self._clock: IReactorTime = reactor
        self._timeout = timeout
        self._spread = spread
        self._factory = self._start(address, reactor, timeout, poolsize)
        self._scripts_held: Set[bytes] = set()  # shas this Redis is known to hold (pipeline_outcomes)

    def _start(self, address: RedisAddress, reactor: Any, timeout: float, poolsize: int) -> txredisapi.RedisFactory:
        """Make the pool and start connecting it (``SentinelLink`` finds its server another way)."""
        factory = _Factory(address.describe(), address.db, poolsize, **pool_options(address, timeout))
        factory.startConnecting(endpoint_for(address, reactor, timeout))
        return factory

    def close(self) -> defer.Deferred:
        """Close every connection and stop reconnecting."""
        return self._factory.disconnect()

    def execute(self, *command: Arg) -> defer.Deferred:
        """Send one command; fires with its raw reply."""
        return self.pipeline([command]).addCallback(lambda replies: replies[0])

    def pipeline(self, commands: Sequence[Command]) -> defer.Deferred:
        """Send commands back to back on one connection; fires with the replies, or fails with the first error."""
        return self._send(commands, _raise_first_error)

    def send_each(self, commands: Sequence[Command]) -> defer.Deferred:
        """Like ``pipeline``, but fires with an ``Outcome`` per command instead of failing on the first error reply.

        The commands go down one connection in this order, so a command
        that must follow another on the same connection (``ASKING``) can.
        A lost connection or a timeout still fails the whole batch.
        """
        return self._send(commands, _outcomes)

    def _send(self, commands: Sequence[Command], then: Callable[..., Any], *then_args: Any) -> defer.Deferred:
        """``then(replies, *then_args)``, the raw replies of ``commands`` sent together (error replies as values).

        ``then`` and the translation of a failed batch into the store's
        errors are one link of the Deferred's chain, not two: a write waits
        for Redis with its chain, and PyPy's minor collections copy it.
        """
        # Every command goes down the pool's first connection while it is
        # up, at no cost of a Deferred or a timer; only waiting for one costs
        # them. Twisted sends what a connection queued once per reactor turn,
        # so the commands of one turn leave in one write and their replies
        # come back in one read. Spread over 4 connections in turn, a reactor
        # turn cost a send, a read and two epoll_ctl per connection: fewer
        # system calls per document read this way (strace -c), and less worker
        # CPU (loadtest/ab_cpu.sh; 10 KB reads the same, with reads of at most
        # 64 KiB: cache.redis.reply_buffer; docs/history/performance.md, "The
        # changes, in the order done"). The others stand by: a lost or
        # timed-out connection leaves the queue and the next one is first,
        # without waiting for a redial.
        connections = self._factory.connectionQueue.pending
        if self._spread and connections:
            idlest = min(connections, key=_backlog)
            if idlest.connected:
                connections = [idlest]
        if connections and connections[0].connected:
            sent = connections[0].send(commands)
        else:
            sent = self._connection().addCallback(lambda connection: connection.send(commands))
        return sent.addCallbacks(then, _as_store_failure, callbackArgs=then_args)

    def run_script(self, script: Script, keys: Sequence[bytes], args: Sequence[Arg]) -> defer.Deferred:
        """Run a Lua script by its SHA, loading it first if Redis lacks it."""
        commands = [script.call(keys, args)]
        return self._send(commands, self._script_replies, commands, [script], True)

    def run_script_waiting(
        self, script: Script, keys: Sequence[bytes], args: Sequence[Arg], wait: Command
    ) -> defer.Deferred:
        """``run_script``, then ``wait`` (a ``WAIT``) on the same connection: fires with both replies."""
        sent = self.pipeline_scripts([script.call(keys, args), wait], [script])
        return sent.addCallback(tuple)

    def pipeline_scripts(self, commands: Sequence[Command], scripts: Sequence[Script]) -> defer.Deferred:
        """``pipeline``, where commands may call ``scripts`` by SHA.

        A Redis that lacks a script (it restarted) refuses the call with
        NOSCRIPT without running it; the scripts are then loaded and the
        batch sent once more, so a batch must be safe to repeat when a
        script call in it failed.
        """
        # Plain callbacks, not a generator: a document read goes through
        # here, and its replies bound to the locals of a generator frame
        # that PyPy moved to the old generation while it waited would be
        # kept through the next minor collection (handlers/documents.py).
        return self._send(commands, self._script_replies, commands, scripts, False)

    def _script_replies(
        self, replies: List[Any], commands: Sequence[Command], scripts: Sequence[Script], first_only: bool
    ) -> Any:
        """The replies (or the first alone), or the first error reply raised; NOSCRIPT loads and resends."""
        try:
            _raise_first_error(replies)
        except RedisReplyError as error:
            if not _no_script(error):
                raise
            resent = self._load(scripts).addCallback(lambda _: self.pipeline(commands))
            return resent.addCallback(_first) if first_only else resent
        return replies[0] if first_only else replies

    def _load(self, scripts: Sequence[Script]) -> defer.Deferred:
        """``SCRIPT LOAD`` of each of ``scripts`` (Redis restarted, or flushed its scripts)."""
        return self.pipeline([(b"SCRIPT", b"LOAD", script.source) for script in scripts])

    def pipeline_outcomes(
        self, commands: Sequence[Command], scripts: Sequence[Script], wait: Optional[Command] = None
    ) -> defer.Deferred:
        """An ``Outcome`` per command, in order: an error reply fails its own command only.

        For a batch of independent operations, where one refused write must
        not hide what the others did. ``wait`` (a ``WAIT``) goes last on the
        same connection, and its outcome is the last one. Commands refused
        with NOSCRIPT (Redis restarted) are sent again, in order, once the
        scripts are loaded: they did not run.
        """
        sent = [*commands, wait] if wait is not None else list(commands)
        loaded = self._scripts_loaded(scripts)
        return loaded.addCallback(lambda _: self.send_each(sent)).addCallback(
            self._resend_without_scripts, sent, scripts, wait is not None
        )

    def _scripts_loaded(self, scripts: Sequence[Script]) -> defer.Deferred:
        """``scripts`` loaded before a pipeline of outcomes calls them (once per Redis, until a NOSCRIPT).

        The resend below relies on a NOSCRIPT refusing every script call after
        it, which holds when Redis lost all its scripts (a restart, a flush),
        not when only some were ever loaded: a batch's get whose script was
        new to Redis was refused and resent after the same batch's delete of
        its document had run, and answered 404 (tests/cache/test_response_budget.py
        after tests/handlers/test_collections.py). So a pipeline's scripts are all there
        before it is sent; a NOSCRIPT then means Redis lost them all.
        """
        if all(script.sha in self._scripts_held for script in scripts):
            return defer.succeed(None)
        return self._load(scripts).addCallback(self._held, scripts).addErrback(lambda _: None)

    def _held(self, _: Any, scripts: Sequence[Script]) -> None:
        self._scripts_held.update(script.sha for script in scripts)

    def _resend_without_scripts(
        self, outcomes: List[Outcome], sent: List[Command], scripts: Sequence[Script], waits: bool
    ) -> Any:
        refused = [index for index, (ok, value) in enumerate(outcomes) if not ok and _no_script(value)]
        if not refused:
            return outcomes
        self._scripts_held.clear()  # Redis lost them (restarted, flushed): loaded below, and all again next time
        # From the first refused command on, the refused ones run now, and
        # the reads among the others run again after them, so each read still
        # sees the writes sent before it. (Scripts are loaded and flushed all
        # together, so a script call past the first refusal was refused too.)
        missing = [
            index for index in range(refused[0], len(sent) - waits) if index in refused or sent[index][0] != b"EVALSHA"
        ]
        if waits:
            missing.append(len(sent) - 1)  # wait for what the resent writes did too
        loaded = self._load(scripts).addCallback(self._held, scripts)
        again = loaded.addCallback(lambda _: self.send_each([sent[index] for index in missing]))

        def merged(results: List[Outcome]) -> List[Outcome]:
            for index, outcome in zip(missing, results):
                outcomes[index] = outcome
            return outcomes

        return again.addCallback(merged)

    @defer.inlineCallbacks
    def _connection(self) -> Any:
        """A live connection of the pool (txredisapi's ``peek``), waiting up to the timeout for one."""
        waiting = self._factory.getConnection(peek=True)
        waiting.addTimeout(self._timeout, self._clock)
        try:
            connection = yield waiting
        except (defer.TimeoutError, defer.CancelledError, txredisapi.ConnectionError):
            raise RedisUnavailable("no connection to Redis") from None
        return connection


def _backlog(connection: Any) -> int:
    """Batches a connection has sent and not had answered; a dead one counts as full."""
    return connection.backlog if connection.connected else 1 << 30


def _no_script(error: Any) -> bool:
    return isinstance(error, RedisReplyError) and str(error).startswith("NOSCRIPT")


def _first(replies: List[Any]) -> Any:
    return replies[0]


def _raise_first_error(replies: List[Any]) -> List[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise store_error(reply)
    return replies


def _outcomes(replies: List[Any]) -> List[Outcome]:
    return [(False, store_error(reply)) if isinstance(reply, Exception) else (True, reply) for reply in replies]


def _as_store_failure(failure: Failure) -> Failure:
    """A failed batch as the store's own error type."""
    error = store_error(failure.value)
    if error is failure.value:
        return failure
    raise error


def store_error(error: BaseException) -> BaseException:
    """txredisapi's error as the store's own type (others unchanged)."""
    if isinstance(error, txredisapi.TimeoutError):
        return RedisTimeout(str(error))
    if isinstance(error, txredisapi.ConnectionError):
        return RedisUnavailable(str(error))
    if isinstance(error, txredisapi.ResponseError):
        return reply_error(str(error))
    return error


def pool_options(address: RedisAddress, timeout: float) -> Dict[str, Any]:
    """How every pool talks to a data node: raw bytes in and out, a reply deadline."""
    return {
        "isLazy": True,
        "charset": None,
        "password": address.password,
        "username": address.username,
        "replyTimeout": timeout,
        "convertNumbers": False,
    }


def endpoint_for(address: RedisAddress, reactor: Any, timeout: float) -> Any:
    """The Twisted client endpoint that dials ``address``."""
    if address.unix_path:
        return UNIXClientEndpoint(reactor, address.unix_path, timeout=timeout)
    endpoint = HostnameEndpoint(reactor, address.host, address.port, timeout=timeout)
    return wrap_tls(address, endpoint) if address.tls else endpoint
