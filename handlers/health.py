"""``/healthz`` (the process is up) and ``/readyz`` (and Redis answers).

Readiness is Redis's last answer to a PING, kept for ``READY_FOR`` seconds
per worker and shared by the checks that arrive while a PING is out: a
fleet of load-balancer health checkers then costs Redis at most a couple of
PINGs a second per worker, and a Redis that goes away turns ``/readyz`` to
503 within ``READY_FOR`` plus the PING's timeout (a second in all).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Dict, List, Optional

from twisted.internet import defer

from cache.documents.store import DocumentStore
from handlers.base import RETRY_AFTER_SECONDS, JsonHandler
from handlers.http.errors import ApiError
from handlers.http.reply import JSON_TYPE, Reply
from handlers.pipeline import Exchange, Pipeline, run

# The release this code is (`make release` writes RELEASE beside the packages;
# a checkout has none). /healthz names it, so a rolling upgrade can be seen
# to have put every worker on the new code (docs/deploy.md).
RELEASE_FILE = Path(__file__).resolve().parent.parent / "RELEASE"
RELEASE_HEADER = "X-Jetway-Release"

# How long a successful PING vouches for Redis, and how long one may take.
READY_FOR = 0.5
PING_TIMEOUT = 0.5


class ReadinessProbe:
    """Whether Redis answers, asked at most once per ``READY_FOR`` seconds."""

    def __init__(self, store: DocumentStore, clock: Any, timeout: float = PING_TIMEOUT) -> None:
        self.store = store
        self.clock = clock
        self.timeout = timeout
        self._ready_until = float("-inf")
        self._waiting: Optional[List[defer.Deferred]] = None

    def check(self) -> defer.Deferred:
        """Fires True when Redis answered a PING recently or answers one now, else False."""
        if self.clock.seconds() < self._ready_until:
            return defer.succeed(True)
        answer: defer.Deferred = defer.Deferred()
        if self._waiting is not None:
            self._waiting.append(answer)  # a PING is out: share its answer
            return answer
        self._waiting = [answer]
        # maybeDeferred: a link that fails at once (a certificate it cannot
        # trust) raises rather than returning a failed Deferred. Either way
        # the answer may come before this returns.
        ping = defer.maybeDeferred(self.store.ping).addTimeout(self.timeout, self.clock)
        ping.addCallbacks(lambda _: True, lambda _: False).addCallback(self._answered)
        return answer

    def _answered(self, ready: bool) -> None:
        # Only a success is kept: a Redis that comes back is seen at the next check.
        if ready:
            self._ready_until = self.clock.seconds() + READY_FOR
        waiting, self._waiting = self._waiting or [], None
        for answer in waiting:
            answer.callback(ready)


@functools.lru_cache(maxsize=1)
def release() -> str:
    """This code's release label, read once per process; empty outside a release."""
    try:
        return RELEASE_FILE.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return ""


# What the metrics count /healthz's answers as when the connection sends them (jetway_direct_answers_total).
HEALTH = "health"


class Liveness:
    """``/healthz``'s pipeline: one reply, made once, which the connection sends without a handler (issue #60).

    A load balancer asks it many times a second on every worker: it costs
    the head's parse, this reply's head and the access log line, no more.
    """

    def __init__(self) -> None:
        headers = ((RELEASE_HEADER, release()),) if release() else ()
        self.reply = Reply(200, JSON_TYPE, headers, b'{"status":"ok"}', kind=HEALTH)

    def live(self, exchange: Exchange) -> Reply:
        return self.reply


class LivenessHandler(JsonHandler):
    """The same reply, for the requests the connection leaves to Cyclone (HTTP/1.0, ``Connection: close``)."""

    ROUTE = "healthz"

    def initialize(self, answers: Liveness, pipelines: Dict[str, Pipeline], **_: Any) -> None:
        self.pipelines = pipelines

    def get(self) -> None:
        request = self.request
        exchange = Exchange(request.method, request.path, request.query, (), request.headers, b"", self.request_id)
        self.send_reply(run(self.pipelines[request.method], exchange))

    head = get


class ReadinessHandler(JsonHandler):
    ROUTE = "readyz"

    def initialize(self, probe: ReadinessProbe) -> None:
        self.probe = probe

    @defer.inlineCallbacks
    def get(self) -> Any:
        ready = yield self.probe.check()
        if not ready:
            # Why Redis does not answer is not the load balancer's business.
            raise ApiError(503, "not-ready", "Redis does not answer", {"Retry-After": RETRY_AFTER_SECONDS})
        self.send_bytes(200, b'{"status":"ready"}')

    head = get
