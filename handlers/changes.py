"""``GET /v1/_changes/{coll}``: a collection's change feed, as SSE or as a long poll.

- ``Accept: text/event-stream``: Server-Sent Events from now, or from
  ``Last-Event-ID`` (what a browser's ``EventSource`` sends when it
  reconnects) or ``?since=``. First a ``ready`` event with ``retry:`` and the
  starting position as its ``id:``, then every change as ``id:`` (the
  position after it) and ``data:`` ``{"op","id","etag","time"}``, plus
  ``"doc"`` with ``?include_docs=true``; the stream itself is
  ``handlers.feed.event_stream`` and ``handlers.feed.feed``. With a query's
  filters, a live query's events only (below).
- Otherwise a long poll: ``{"events": [...], "next": "<position>"}``, up to
  ``limit`` events after ``since`` (or now), waiting up to ``wait`` seconds
  for the first. With a query's filters (``?status=eq.open``) it is a live
  query (``cache.feed.live_queries``): only the events of documents that match
  the query, or stopped matching it, each with ``"matches"``.

A position older than what the feed keeps is a 410 ``feed-position-lost``
(on a stream mid-way: a ``lost`` event, then the end). Read scope on the
collection, by bearer token or by ``?ticket=`` (``handlers.tickets``),
checked for as long as the stream or the poll lasts: when the token is
revoked or rotated or expires, or the ticket expires, a stream ends with an
``unauthorized`` event and a long poll answers a 401 at once
(``cache.credentials.watch``; docs/credentials.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs

from twisted.internet import defer

from cache.collection_settings import CollectionSettings
from cache.credentials.watch import TICKET_EXPIRED, TOKEN_EXPIRED, TOKEN_REVOKED, Hold
from cache.feed import position as feed_position
from cache.feed.live_queries import LiveQuery
from cache.feed.position import Position, PositionError, advanced
from cache.feed.streams import Event, Page
from cache.indexes import filters as index_filters
from cache.ownership import OWNER_FIELD, OwnerRule
from handlers.base import ResourceHandler
from handlers.feed.event_stream import LOST_DETAIL, EventStream, ready_event
from handlers.feed.feed import Feed
from handlers.feed.subscriber import Subscription
from handlers.http import validation
from handlers.http.auth import unauthorized
from handlers.http.errors import ApiError, bad_request
from handlers.ownership import bound_owner
from handlers.pipeline import then
from handlers.tickets import TicketGate, feed_off

EVENT_STREAM = "text/event-stream"
# Why a stream or a poll ended early, after "the " or "the ticket's ": the ``unauthorized`` event's detail, the 401's.
ENDED_DETAILS = {
    TOKEN_REVOKED: "token was revoked or rotated",
    TOKEN_EXPIRED: "token expired",
    TICKET_EXPIRED: "ticket expired: ask for a new one, then reconnect with Last-Event-ID",
}


# Events a live query's long poll looks at most before it answers, reads from a shard at once, and the
# feed polls (each up to two reads of every shard) it makes at most: ChangesHandler._scan says why.
LIVE_LOOK = 10_000
LIVE_PER_SHARD = 256
LIVE_POLLS = 3
# The feed's own arguments (the operation table's ``getChanges``, its ticket with them): never a live
# query's filters, whatever their values look like.
FEED_ARGUMENTS = frozenset({"since", "include_docs", "wait", "ticket", "limit"})


def gone() -> ApiError:
    return ApiError(410, "feed-position-lost", LOST_DETAIL)


def wants_events(accept: Optional[str]) -> bool:
    """Whether ``Accept`` asks for ``text/event-stream`` (with a weight above 0)."""
    if not accept or EVENT_STREAM not in accept.lower():
        return False
    for part in accept.lower().split(","):
        media, *params = [piece.strip() for piece in part.split(";")]
        if media == EVENT_STREAM:
            return not any(param.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for param in params)
    return False


def _flag(name: str, text: Optional[str]) -> bool:
    if text is None or text == "false":
        return False
    if text == "true":
        return True
    raise bad_request(f"{name} must be true or false", f"invalid-{name}")


def _seconds(name: str, text: Optional[str], high: int) -> int:
    if text is None:
        return 0
    if not text.isascii() or not text.isdigit() or int(text) > high:
        raise bad_request(f"{name} must be a whole number of seconds from 0 to {high}", f"invalid-{name}")
    return int(text)


class ChangesHandler(ResourceHandler):
    ROUTE = "changes"

    def initialize(self, feed: Optional[Feed], ticket_gate: Optional[TicketGate], **documents: Any) -> None:
        super().initialize(**documents)
        self.feed = feed
        self.ticket_gate = ticket_gate
        self.stream: Optional[EventStream] = None
        self.subscription: Optional[Subscription] = None
        self._gone = False
        self._ended = False
        self._hold: Optional[Hold] = None
        self._credential_ended: Optional[str] = None
        self._stop_poll: Optional[defer.Deferred] = None
        # Under a collection's owner rule: the rule and the owner the caller is bound to (its feed's live query).
        self.owned_by: Optional[Tuple[OwnerRule, str]] = None

    def prepare(self) -> Optional[defer.Deferred]:
        if self.request.method != "OPTIONS" and self.feed is None:
            raise feed_off()  # before admission: there is no feed to be admitted to
        return super().prepare()

    def get(self, collection: str) -> defer.Deferred:
        name = validation.collection_name(collection)
        return defer.maybeDeferred(then, self.settings_now(name), self._follow, name)

    def _follow(self, settings: CollectionSettings, name: bytes) -> defer.Deferred:
        with_docs = _flag("include_docs", self.query_argument("include_docs"))
        arguments = parse_qs(self.request.query, keep_blank_values=True)
        filters = index_filters.filters_of(arguments, index_filters.field_names(settings.indexes), FEED_ARGUMENTS)
        owner = bound_owner(self.grant, settings)
        if owner is not None:
            # A user bound by the owner rule follows a live query of its own documents: their events only, and
            # a document that left its ownership is told once, as one that no longer matches (cache.feed).
            filters = {**filters, OWNER_FIELD: [*filters.get(OWNER_FIELD, ()), "eq." + owner]}
            # The docs lane attaches a document as it is when the event is sent: only if it is still the user's.
            self.owned_by = (settings.owner, owner)
        if wants_events(self.request.headers.get("Accept")):
            return self._stream(name, with_docs, filters)
        return self._poll(name, with_docs, filters)

    @defer.inlineCallbacks
    def _live_query(self, name: bytes, filters: Dict[str, List[str]]) -> Any:
        """The filters as a live query over one of the collection's indexes (``cache.feed.live_queries``)."""
        if "order" in filters:
            raise bad_request("a live query has the feed's order: no order", "invalid-query")
        settings = yield self.collection_settings(name)
        query = yield self.planned_query(name, settings.indexes, filters, 1)
        return LiveQuery.of(query, self.owned_by)

    def _position(self, name: bytes, resuming: bool) -> Optional[Position]:
        """Where to start: ``Last-Event-ID`` (a stream resuming), else ``since``; None for now."""
        token = self.request.headers.get("Last-Event-ID") if resuming else None
        if not token:
            token = self.query_argument("since")
        if not token:
            return None
        try:
            return feed_position.decode(name, token)
        except PositionError as error:
            raise bad_request(
                f"since / Last-Event-ID is not a position in {name.decode()}'s feed ({error})", "invalid-position"
            ) from None

    # -- the credential, for as long as it is used -------------------------

    def _watch_credential(self) -> None:
        """From now on, the credential's death ends the stream (or the poll) at once."""
        self._hold = self.gate.hold(self.grant, self._credential_died)

    def _credential_died(self, reason: str) -> None:
        self._credential_ended = reason
        if self._stop_poll is not None and not self._stop_poll.called:
            self._stop_poll.callback(None)
        if self.stream is not None:
            self.stream.end_unauthorized(reason, self._ended_detail(reason))

    def _ended_detail(self, reason: str) -> str:
        by_ticket = self.grant.ticket_expires and reason != TICKET_EXPIRED
        return ("the ticket's " if by_ticket else "the ") + ENDED_DETAILS[reason]

    def _refused(self) -> ApiError:
        assert self._credential_ended is not None
        return unauthorized(self._ended_detail(self._credential_ended))

    def on_finish(self) -> None:
        if self._hold is not None:
            self._hold.release()

    # -- the long poll ----------------------------------------------------

    @defer.inlineCallbacks
    def _poll(self, name: bytes, with_docs: bool, filters: Dict[str, List[str]]) -> Any:
        assert self.feed is not None
        limit = validation.limit(self.query_argument("limit"))
        wait = _seconds("wait", self.query_argument("wait"), self.feed.limits.max_wait)
        position = self._position(name, resuming=False)
        live = (yield self._live_query(name, filters)) if filters else None
        self._stop_poll = defer.Deferred()
        self._watch_credential()
        if position is None:
            position = yield self.feed.now(name)
        if live is None:
            page: Page = yield self.feed.poll(name, position, limit, wait, self._stop_poll)
            if page.lost:
                raise gone()
            judged: List[Tuple[Event, Optional[bool]]] = [(event, None) for event in page.events]
            position = page.position
        else:
            judged, position = yield self._scan(name, live, position, limit, wait)
        docs: Dict[bytes, Optional[bytes]] = {}
        if with_docs and judged:
            ids = list(dict.fromkeys(event.doc_id for event, _ in judged))
            bodies = yield self.feed.reader.documents(name, ids)
            # Under an owner rule, a document is attached only while it is the user's (``LiveQuery.shows``).
            docs = dict(zip(ids, bodies if live is None else [live.shows(body) for body in bodies]))
        if self._credential_ended is not None:
            raise self._refused()
        events = b",".join([event.json(with_docs, docs.get(event.doc_id), matches) for event, matches in judged])
        following = feed_position.encode(name, position).encode("ascii")
        self.set_header("Cache-Control", "no-store")
        self.send_bytes(200, b'{"events":[' + events + b'],"next":"' + following + b'"}')

    @defer.inlineCallbacks
    def _scan(self, name: bytes, live: LiveQuery, position: Position, limit: int, wait: float) -> Any:
        """A live query's events after ``position``: up to ``limit`` of its own, and the position after the last
        event looked at.

        It reads on past events that are none of its own (waiting, once it has read them all, as long as it was
        asked to), in reads of up to ``LIVE_PER_SHARD`` events a shard whatever its ``limit``, and looks at
        ``LIVE_LOOK`` events at most, in ``LIVE_POLLS`` polls at most (each a read, and one more if it waited
        and was woken): then an empty page whose next is not its since. So a poll costs at most 6 round trips
        of one script a shard, 96 calls, whatever the feed holds or is written while it waits (issue #55 item
        5: one event a shard a round trip made 160,000 script calls of a poll over 10,000 events).
        """
        assert self.feed is not None
        deadline, looked, polls = self.feed.clock.seconds() + wait, 0, 0
        judged: List[Tuple[Event, Optional[bool]]] = []
        while True:
            polls += 1
            page: Page = yield self.feed.poll(
                name, position, LIVE_LOOK - looked, wait, self._stop_poll, per_shard=LIVE_PER_SHARD
            )
            if page.lost:
                raise gone()
            for event in page.events:
                looked += 1
                position = advanced(position, event.shard, event.stream_id)
                matches = live.judge(event)
                if matches is not None:
                    judged.append((event, matches))
                    if len(judged) >= limit:
                        return judged, position
            wait = max(0.0, deadline - self.feed.clock.seconds())
            if judged or not page.events or looked >= LIVE_LOOK or polls >= LIVE_POLLS:
                return judged, position
            if self._credential_ended is not None or self.feed.draining:
                return judged, position

    # -- the stream -------------------------------------------------------

    @defer.inlineCallbacks
    def _stream(self, name: bytes, with_docs: bool, filters: Dict[str, List[str]]) -> Any:
        assert self.feed is not None
        position = self._position(name, resuming=True)
        live = (yield self._live_query(name, filters)) if filters else None
        self._watch_credential()
        subscription = self.feed.subscription(name, with_docs, live)
        try:
            first = yield subscription.start(position)
        except BaseException:
            subscription.cancel()
            raise
        if first is not None and first.lost:
            subscription.cancel()
            raise gone()
        if self._gone:
            subscription.cancel()  # the client left while the start was read
            return
        if self._credential_ended is not None:
            subscription.cancel()
            raise self._refused()
        self.subscription = subscription
        self._open(feed_position.encode(name, subscription.position))
        assert self.stream is not None
        if self.feed.draining:
            self.stream.end_reconnect("the server is shutting down; reconnect with Last-Event-ID")
            return
        subscription.run(self.stream, first)

    def _open(self, token: str) -> None:
        """The response head and the ``ready`` event; from here on the stream answers, not Cyclone."""
        assert self.feed is not None
        self.set_status(200)
        self.set_header("Content-Type", EVENT_STREAM)
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")  # nginx would hold events back to fill its buffer
        connection = self.request.connection
        chunked = self.request.supports_http_1_1()
        if chunked:
            self.set_header("Transfer-Encoding", "chunked")
        else:
            connection.keep_alive = False  # HTTP/1.0: the body ends with the connection
        head = self.take_head()
        limits = self.feed.limits
        self.stream = EventStream(
            connection.transport,
            chunked,
            limits.buffer,
            limits.stall_seconds,
            self.feed.clock,
            self.feed.stats,
            self._stream_ended,
        )
        self.feed.stream_opened(self.stream)
        self.stream.open(head, ready_event(token))

    def _stream_ended(self) -> None:
        """The stream's end, whoever ended it: one access line and one request in the metrics."""
        if self._ended:
            return
        self._ended = True
        assert self.feed is not None and self.stream is not None
        self.feed.stream_closed(self.stream)
        if self.subscription is not None:
            self.subscription.cancel()
        self.request.connection.no_keep_alive = True
        if not self.finished:
            self.finish()

    def on_connection_close(self, *args: Any) -> None:
        if self._hold is not None:
            self._hold.release()
        if self.finished:
            return
        self._gone = True
        if self.stream is not None and self.feed is not None:
            self.stream.connection_lost()
            # Not from inside this callback: Cyclone's connection fires it
            # before it lets go of it, and finishing would fire it again.
            self.feed.clock.callLater(0, self._stream_ended)
