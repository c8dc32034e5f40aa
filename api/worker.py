"""A worker process: adopts a listening socket and serves the app on it.

Started by the master (``--fd 3 --ready-fd 4 --log-pipe``) or by another
parent such as supervisor (``--fd N``). Its log lines go to stdout through
``api.log_writer``: with ``--log-pipe`` stdout is a pipe this worker alone
writes, and it is written without ever blocking. On SIGTERM/SIGINT it drains (``api.drain``): it stops
accepting, answers what may be in flight with ``Connection: close``, closes
a connection only where no request can be on its way, and exits, within ``JETWAY_GRACE``;
one that comes while it warms up stops it before it serves. It ignores
SIGHUP: only the master reloads (``api.signals``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from functools import partial
from typing import Any, Callable, List, Optional, Tuple

from twisted.internet import defer, task
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from api.app import make_app
from api.application import JetwayApplication
from api.config import Settings
from api.drain import Drain
from api.eager_send import adopt_listening_socket
from api.handoff import Receiver
from api.log_writer import LineWriter
from api.logs import LineStream, start_logging
from api.observe import HotCacheMetrics, Metrics
from api.signals import dump_stacks_on, ignore_hangups, on_signals, stop_reactor
from api.warm_up import WarmUpReport, warm_up
from api.warm_up_scratch import warm_up_on_redis
from cache.batches.batch import BatchRunner
from cache.collection_settings import CollectionSettingsStore
from cache.credentials.jwt_tokens import JwtVerifier
from cache.credentials.tickets import TicketStore
from cache.credentials.token_cache import TokenCache
from cache.credentials.tokens import TokenStore
from cache.documents.expiry import ExpirySweeper
from cache.documents.idempotency import IdempotencyRecords
from cache.documents.store import DocumentStore
from cache.documents.variants import Variants
from cache.feed.streams import NO_FEED, FeedLog, FeedReader
from cache.hot.cache import HotCache
from cache.hot.tracking import invalidation_feed
from cache.indexes.upkeep import follow_settings_changes
from cache.keys import INDEX_SHARDS
from cache.memory_return import give_back
from cache.redis.address import CLUSTER, RedisAddress
from cache.redis.lazy_link import LazyLink
from cache.redis.metered import MeteredLink
from cache.redis.topology import connect, watched
from cache.settings_cache import SettingsCache
from handlers.feed.feed import Feed, FeedLimits
from handlers.http.auth import Gate

# How far behind a scrape may see other workers' counts.
METRICS_FLUSH_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1
_log = Logger()


def run_worker(
    settings: Settings,
    reactor: Any,
    fd: int,
    ready_fd: Optional[int] = None,
    app_factory: Callable[..., JetwayApplication] = make_app,
    log_pipe: bool = False,
    handoff_fd: Optional[int] = None,
    slot: Optional[int] = None,
) -> int:
    """Serve on the listening socket ``fd`` until drained; returns the exit code.

    ``app_factory`` is ``make_app`` but for the bench's re-encoding variant;
    ``log_pipe``: stdout is a pipe of this worker's own (``api.log_writer``);
    ``handoff_fd``: connections the master hands over (``api.handoff``);
    ``slot``: the master's slot it serves, for its log line.
    """
    ignore_hangups()
    dump_stacks_on(signal.SIGUSR2)
    stops = StopSignals(reactor)
    reactor.callWhenRunning(on_signals, reactor, stops, signal.SIGTERM, signal.SIGINT)
    metrics = Metrics()
    sys.stdout.flush()
    lines = LineWriter(sys.stdout.fileno(), log_pipe, metrics.count_dropped_lines)
    lines.watch_with(reactor)
    start_logging(LineStream(lines), settings.json_logs)
    if ready_fd is not None:
        _die_with_parent()
    app, feed = assemble(settings, reactor, metrics, lines, app_factory)
    reactor.addSystemEventTrigger("before", "shutdown", app.observer.flush)
    # After the observer's flush (triggers of one phase run in order), so the last access lines go too.
    reactor.addSystemEventTrigger("before", "shutdown", lines.close)

    def serve(warmed: Optional[List[WarmUpReport]] = None) -> None:
        if stops.stopping:
            return  # told to stop while warming up: nothing to drain
        # What the warm-ups allocated and left (collected at their end, api.warm_up_scratch) goes back to
        # the system: glibc keeps freed pages otherwise (docs/operations.md, "Memory").
        give_back()
        port = adopt_listening_socket(reactor, fd, _nonblocking_family(fd), app)
        os.close(fd)  # the port took a copy
        app.listen_on(port)
        if handoff_fd is not None:
            Receiver(handoff_fd, reactor, app)
        stops.drain = Drain(app, port, reactor, settings.grace, feed.drain if feed is not None else None)
        flushing = task.LoopingCall(metrics.flush)
        flushing.clock = reactor
        flushing.start(METRICS_FLUSH_SECONDS, now=False)
        if metrics.expiry is not None:
            # Once serving, not in assemble: the warm-up's application is assembled too, on a stand-in Redis.
            metrics.expiry.start()
        log_serving(slot, port.getHost(), warmed)
        # Out before "ready": the master's "serving on" line, which "ready" causes, then comes after it (api.log_relay).
        lines.flush()
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)

    could_not_serve: List[Failure] = []

    def warm_up_then_serve() -> None:
        build = partial(assemble, app_factory=app_factory)
        reports: List[WarmUpReport] = []  # told in the one line that says the worker serves
        warming = defer.maybeDeferred(warm_up, settings, reactor, settings.warm_up, build)
        warming.addCallbacks(reports.append, stops.warm_up_failed)
        # Then the same paths for real, on a scratch collection: the writes' path through Redis (api.warm_up_scratch).
        warming.addCallback(
            lambda _: None if stops.stopping else warm_up_on_redis(settings, reactor, settings.warm_up, build)
        )
        warming.addCallbacks(lambda report: report and reports.append(report), stops.warm_up_failed)
        # As when there is no warm-up, a worker that cannot serve exits (non-zero), it does not hang.
        warming.addCallback(lambda _: serve(reports)).addErrback(
            lambda failure: (could_not_serve.append(failure), stop_reactor(reactor))
        )

    if settings.warm_up:
        # Before the listening socket is taken: no client waits on PyPy's compiler (api.warm_up).
        reactor.callWhenRunning(warm_up_then_serve)
    else:
        serve()
    reactor.run()
    for failure in could_not_serve:
        failure.raiseException()
    return 0


def assemble(
    settings: Settings,
    reactor: Any,
    metrics: Metrics,
    lines: LineWriter,
    app_factory: Callable[..., JetwayApplication] = make_app,
    on_shutdown: Optional[Callable[[Callable[[], Any]], None]] = None,
) -> Tuple[JetwayApplication, Optional[Feed]]:
    """The worker's application and everything it serves with, connected to Redis.

    Also what ``loadtest/studies/_request_path.py`` serves requests with in-process.
    Each part that holds a connection closes it as the reactor shuts down,
    or when ``on_shutdown`` calls what it was given (``api.warm_up``).
    """
    if on_shutdown is None:
        on_shutdown = partial(reactor.addSystemEventTrigger, "before", "shutdown")
    # A Sentinel group's watch: every connection below follows a failover at once (cache.redis.sentinel_watch).
    address = watched(settings.redis, reactor, settings.redis_timeout)
    if address.watch is not None:
        on_shutdown(address.watch.stop)
    redis = connect(address, reactor, settings.redis_timeout, settings.redis_pool)
    link = MeteredLink(redis, metrics.observe_redis)
    hot = None
    if settings.hot_cache_bytes:
        hot = HotCache(settings.hot_cache_bytes, max_lag=settings.hot_cache_max_lag)
        invalidations = invalidation_feed(address, redis, hot, reactor, settings.redis_timeout)
        metrics.hot_cache = HotCacheMetrics(hot.stats)
        on_shutdown(invalidations.stop)
    # WAIT blocks the connection it is sent on: writes that wait get a pool of
    # their own, dialled at once when every write waits, else when a
    # collection's write_replicas first asks for it.
    write_link = LazyLink(
        lambda: MeteredLink(
            connect(address, reactor, settings.redis_timeout, settings.redis_pool, spread=True),
            metrics.observe_redis,
        )
    )
    if settings.write_concern.waits:
        write_link.dial()
    on_shutdown(write_link.close)
    feed_log = (
        FeedLog(True, settings.feed_max_events, settings.feed_max_age, settings.feed_max_bytes)
        if settings.feed
        else NO_FEED
    )
    store = DocumentStore(
        link,
        write_link=write_link,
        write_concern=settings.write_concern,
        hot=hot,
        variants=Variants(settings.compress_min_bytes),
        feed=feed_log,
    )
    metrics.index_builds = store.index_builds
    feed = _feed(settings, address, link, reactor)
    tickets = TicketStore(link, settings.feed_ticket_ttl) if feed is not None else None
    tokens = TokenCache(TokenStore(link), address, reactor, settings.redis_timeout) if settings.auth else None
    collections = SettingsCache(CollectionSettingsStore(link), address, reactor, settings.redis_timeout)
    follow_settings_changes(collections, store.index_builds)
    # Every worker looks for due expiries once it serves; the one holding a collection's lease carries them out
    # (cache.documents.expiry).
    sweeper = ExpirySweeper(link, store.writes.expiring, feed_log, reactor)
    metrics.expiry = sweeper
    on_shutdown(sweeper.stop)
    on_shutdown(collections.close)
    idempotency = IdempotencyRecords(link, settings.idempotency_lease)
    # A batch's writes share script calls by slot on a cluster, and all together on one Redis (cache.batches.groups).
    batches = BatchRunner(store, link, settings.write_concern, write_link, spans_slots=settings.redis.kind != CLUSTER)
    gate = Gate(tokens, link, settings.auth, jwts=_jwts(settings, reactor, on_shutdown))
    app = app_factory(
        settings,
        store,
        gate,
        reactor,
        metrics,
        idempotency,
        batches,
        collections,
        log_lines=lines,
        feed=feed,
        tickets=tickets,
    )
    on_shutdown(link.close)
    if tokens is not None:
        on_shutdown(tokens.close)
    if feed is not None:
        on_shutdown(feed.close)
    return app, feed


def _jwts(settings: Settings, reactor: Any, on_shutdown: Callable[[Callable[[], Any]], None]) -> Optional[JwtVerifier]:
    """The configured OpenID Connect issuers' verifier, their keys fetched from now on (None: none configured)."""
    if not settings.auth or not settings.oidc_issuers:
        return None
    verifier = JwtVerifier(settings.oidc_issuers, reactor)
    verifier.start()  # never fails: an issuer not reached yet answers 503 until its keys come
    on_shutdown(verifier.stop)
    return verifier


def _feed(settings: Settings, address: RedisAddress, link: Any, reactor: Any) -> Optional[Feed]:
    """The change feed's serving side, with its nudge subscription (None when JETWAY_FEED=off)."""
    if not settings.feed:
        return None
    id_every = max(1, settings.feed_max_events // (2 * INDEX_SHARDS))
    limits = FeedLimits(settings.feed_buffer, settings.send_timeout, settings.feed_max_wait, id_every)
    return Feed.connected(FeedReader(link), address, reactor, settings.redis_timeout, limits)


class StopSignals:
    """SIGTERM/SIGINT for the worker's whole life: a drain once it serves; before (warming up), a plain stop."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.drain: Optional[Drain] = None
        self.stopping = False

    def __call__(self) -> None:
        self.stopping = True
        if self.drain is not None:
            self.drain.start()
        else:
            stop_reactor(self.reactor)

    def warm_up_failed(self, failure: Failure) -> None:
        if not self.stopping:  # a stop cuts the warm-up short: that is no failure to report
            _log.failure("warm-up failed; serving without it", failure, level=LogLevel.warn)


def log_serving(slot: Optional[int], address: Any, warmed: Optional[List[WarmUpReport]]) -> None:
    """The worker's one start line: its slot, pid, address and warm-up; a warning if the warm-up had trouble."""
    pid = os.getpid()
    where = f":{address.port}" if hasattr(address, "port") else str(getattr(address, "name", address))
    worker = "worker" if slot is None else f"worker {slot}"
    if warmed is None:
        outcome = "no warm-up (JETWAY_WARM_UP=0)"
    elif not warmed:
        outcome = "warm-up failed"
    else:
        outcome = ", ".join(report.describe() for report in warmed)
    troubled = warmed is not None and (not warmed or any(report.trouble for report in warmed))
    fields = {"pid": pid, "slot": slot} if slot is not None else {"pid": pid}
    _log.emit(
        LogLevel.warn if troubled else LogLevel.info,
        "{worker} (pid {pid}) serving on {where}: {outcome}",
        worker=worker,
        pid=pid,
        where=where,
        outcome=outcome,
        jetway_fields=fields,
    )


def _nonblocking_family(fd: int) -> socket.AddressFamily:
    """The socket's address family; also makes it non-blocking.

    Twisted needs a non-blocking socket, and a parent such as supervisor may
    hand over a blocking one. The flag belongs to the open socket, so it
    holds for every process sharing it.
    """
    with socket.socket(fileno=os.dup(fd)) as probe:
        probe.setblocking(False)
        return probe.family


def _die_with_parent() -> None:
    """Get SIGTERM if the master dies, so no worker outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() == 1:
        sys.exit(0)
