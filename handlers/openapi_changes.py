"""The change feed's part of ``/openapi.json``: its two paths, parameters and schemas.

Built with ``handlers.openapi``'s builders and merged into its document by
``openapi_document``; the limits come from the same constants and settings
the handlers check (``handlers.changes``, ``handlers.tickets``).
"""

from __future__ import annotations

from typing import Any, Dict

from handlers.base import JSON_TYPE
from handlers.changes import EVENT_STREAM
from handlers.feed.event_stream import HEARTBEAT_SECONDS, RETRY_MS
from handlers.http import validation
from handlers.openapi import (
    _REDIS,
    _errors,
    _object,
    _operation,
    _parameter,
    _parameters_named,
    _path_item,
    _ref,
    _response,
)

Json = Dict[str, Any]
CHANGES = "/v1/_changes/{collection}"
TICKETS = "/v1/_changes/{collection}/tickets"

PROBLEM_TYPES = (
    ("invalid-position", "400: `since` or `Last-Event-ID` is not a position of this collection's feed"),
    ("invalid-wait", "400: `wait` is not a whole number of seconds in range, or is given twice"),
    ("invalid-include_docs", "400: `include_docs` is not `true` or `false`, or is given twice"),
    ("invalid-ticket", "400: `ticket` is given twice"),
    ("feed-off", "404: the change feed is turned off on this server (`JETWAY_FEED=off`)"),
    (
        "feed-position-lost",
        "410: events after the position are no longer kept (the feed's cap, or a failover lost them):"
        " re-list the collection, then follow from a new position",
    ),
)
_SECURITY = [{"bearer": []}, {"ticket": []}]
_FEED_OFF = "The change feed is turned off on this server (`feed-off`)."
_LOST = (
    "Events after `since` / `Last-Event-ID` are no longer kept (`feed-position-lost`): the feed's cap"
    " (`JETWAY_FEED_MAX_EVENTS`, `JETWAY_FEED_MAX_AGE`) dropped them, or a failover lost them with their"
    " writes. Open the feed from now (no `since`: its `next` or `ready` position), re-list the collection,"
    " then apply the feed's events from that position."
)
_STREAM = (
    "With `Accept: text/event-stream`: Server-Sent Events, chunked, until the server ends them. First"
    f' `retry: {RETRY_MS}`, `id:` (the starting position) and `event: ready` with `{{"position": ...}}`;'
    " then each change as `id:` (the position after it, what `Last-Event-ID` resumes from) and `data:`"
    " (a `ChangeEvent`); a comment line every"
    f" {HEARTBEAT_SECONDS:g} s. Named events that end the stream: `fell-behind` (the client did not read its"
    " buffer in time: reconnect), `lost` (as the 410), `reconnect` (the server is shutting down, or could not"
    " read the feed: reconnect). Otherwise a long poll: a `ChangesPage`."
)


def changes_paths(max_wait: int) -> Json:
    return {
        CHANGES: _path_item(
            "A collection's change feed: every write (put, create, patch, delete) in order per document.",
            "Changes",
            {"get": _secure(_changes_operation())},
            ("collection",),
        ),
        TICKETS: _path_item(
            "Tickets for a browser's `EventSource`, which cannot send `Authorization`.",
            "ChangesTicket",
            {"post": _secure(_ticket_operation())},
            ("collection",),
        ),
    }


def _secure(operation: Json) -> Json:
    return {**operation, "security": _SECURITY}


def _changes_operation() -> Json:
    page_or_stream = {
        JSON_TYPE: {"schema": _ref("schemas", "ChangesPage")},
        EVENT_STREAM: {"schema": {"type": "string", "description": "A stream of Server-Sent Events."}},
    }
    ok = _response(_STREAM, headers=("Cache-Control",))
    ok["content"] = page_or_stream
    return _operation(
        "getChanges",
        "Follow a collection's changes: Server-Sent Events (`Accept: text/event-stream`) or a long poll",
        "changes",
        {
            "200": ok,
            **_errors(
                (400, 404, 410, *_REDIS),
                e400="Invalid collection name, `since`, `Last-Event-ID`, `wait`, `limit` or `include_docs`.",
                e401="No valid bearer token or ticket: missing, unknown, revoked, rotated or expired"
                " (never said which).",
                e403="The token (or the ticket's token) lacks read scope on the collection, or the ticket is for"
                " another collection.",
                e404=_FEED_OFF,
                e410=_LOST,
            ),
        },
        parameters=_parameters_named("since", "wait", "changesLimit", "include_docs", "Last-Event-ID"),
    )


def _ticket_operation() -> Json:
    return _operation(
        "createChangesTicket",
        "A ticket to follow this collection's feed by `?ticket=` (for `EventSource`)",
        "changes",
        {
            "201": _response(
                "Issued: good for `GET` of this collection's feed only, until `expires_at`"
                " (`JETWAY_FEED_TICKET_TTL`, default an hour), and only while the token that asked for it is"
                " valid (revoking or rotating the token ends its tickets). `Cache-Control: no-store`.",
                _ref("schemas", "Ticket"),
                ("Cache-Control",),
            ),
            **_errors(
                (400, 404, *_REDIS),
                e400="Invalid collection name.",
                e403="The token lacks read scope on the collection.",
                e404=_FEED_OFF,
            ),
        },
    )


def changes_parameters(max_wait: int) -> Json:
    return {
        "since": _parameter(
            "since",
            "query",
            "A position (an event's `id:`, or a page's `next`): the events after it. From now when absent. A"
            " stream's `Last-Event-ID` takes precedence.",
            {"type": "string"},
        ),
        "wait": _parameter(
            "wait",
            "query",
            "Long poll: seconds to wait for an event when there is none yet; 0 (answer at once) when absent.",
            {"type": "integer", "minimum": 0, "maximum": max_wait},
        ),
        "changesLimit": _parameter(
            "limit",
            "query",
            f"Long poll: the most events in a page; {validation.DEFAULT_LIMIT} when absent.",
            {"type": "integer", "minimum": 1, "maximum": validation.MAX_LIMIT},
        ),
        "include_docs": _parameter(
            "include_docs",
            "query",
            "Each event carries `doc`: the document's stored bytes as they are now (null once deleted).",
            {"type": "boolean"},
        ),
        "Last-Event-ID": _parameter(
            "Last-Event-ID",
            "header",
            "A stream resumes after this position (an `EventSource` sends it when it reconnects).",
            {"type": "string"},
        ),
    }


def changes_schemas() -> Json:
    event = _object(
        {
            "op": {"enum": ["put", "create", "patch", "delete"], "description": "What the write did."},
            "id": _ref("schemas", "DocumentId"),
            "etag": {"type": ["string", "null"], "description": "The document's new ETag; null for a delete."},
            "time": {"type": "string", "format": "date-time", "description": "When Redis stored it (UTC, ms)."},
            "doc": {
                "oneOf": [_ref("schemas", "Document"), {"type": "null"}],
                "description": "With `include_docs`: the document as it is now, null if it is gone.",
            },
        },
        ["op", "id", "etag", "time"],
        "One write. A document's events come in the order of its writes, each once.",
    )
    page = _object(
        {
            "events": {"type": "array", "items": _ref("schemas", "ChangeEvent")},
            "next": {"type": "string", "description": "The position after these events: the next `since`."},
        },
        ["events", "next"],
        "A long poll's page of changes.",
    )
    ticket = _object(
        {
            "ticket": {"type": "string", "description": "Send as `?ticket=`; a secret, like the token."},
            "expires_at": {"type": "string", "format": "date-time"},
        },
        ["ticket", "expires_at"],
        "A read-only credential for one collection's change feed.",
    )
    return {"ChangeEvent": event, "ChangesPage": page, "Ticket": ticket}


TICKET_SCHEME = {
    "type": "apiKey",
    "in": "query",
    "name": "ticket",
    "description": "A ticket from `POST /v1/_changes/{collection}/tickets`: `GET` of that collection's feed only.",
}
