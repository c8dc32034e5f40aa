"""Queries over declared indexes: the filters of a request planned onto an index, then read from every shard.

Syntax, PostgREST's where users know it: ``?field=op.value`` for each
filter, ``op`` one of ``eq``, ``gt``, ``gte``, ``lt``, ``lte``, a field
named by the collection's declared indexes (``cache.indexes.declared``), its value
read as that field's type (a string field takes the text as it is, so
``?email=eq.42`` asks for the string "42"; a number field takes a JSON
number; a boolean field ``true`` or ``false``); ``order=field.asc`` or
``.desc``; ``limit`` and ``cursor`` as list pages have them. Several
filters are ANDed: equality on some fields, and a range (up to one lower
and one upper bound) and/or an order on one more.

Planning: an index answers when its first fields are exactly the equality
filters' (in any order in the query) and, with a range or an order, its
next field is that one. The entries' bytes (``cache.indexes.values``) then
make the query one ``ZRANGEBYLEX`` range: the equality values' bytes as a
prefix, the range's bounds after it. No index answers: ``NoIndex``, whose
message names the index to declare. Never a scan.

Reading: every shard's ``QUERY`` script reads its entries in order and the
bodies of the documents that still hold them, in the same script, so each
body answered matches the query when it is read; the shards' answers are
merged in order, as the change feed merges its streams, and a page ends
where the first shard that had more stopped, so nothing in between is
skipped. The cursor is the last entry answered (base64url): any bytes are
a valid place to resume, clamped to the query's range, so a cursor from
another query cannot widen this one's.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, FrozenSet, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache import keys
from cache.errors import WriteConflict
from cache.indexes.declared import Index, IndexField
from cache.indexes.scripts import QUERY
from cache.indexes.values import BOOLEAN, MAX_STRING_BYTES, NUMBER, encode, id_of, prefix_end
from cache.redis.link import Link

OPERATORS = ("eq", "gt", "gte", "lt", "lte")
# A value that looks like a filter's ``op.value``, whether Jetway knows the operator or not (``neq.5``).
_LOOKS_LIKE_A_FILTER = re.compile(r"[a-z]+\.")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?\Z")
# Entries a shard's script looks at, beyond the page, before it stops (dropping stale ones on its way).
_LOOK_AHEAD = 64


class QueryError(ValueError):
    """A query that cannot be asked as written (maps to 400); the message says why."""


class NoIndex(QueryError):
    """A query no declared index answers (maps to 400); the message names the index to declare."""


class IndexNotReady(Exception):
    """The index is being built (maps to 409 with ``Retry-After``); ``built`` shards of ``shards`` are."""

    def __init__(self, name: str, built: int, shards: int) -> None:
        super().__init__(f"index {name} is being built ({built} of {shards} shards done); retry shortly")
        self.name = name


@dataclass(frozen=True)
class Query:
    """A query planned onto an index: the range of its entries, and the order and page asked."""

    index: Index
    low: bytes  # ZRANGEBYLEX bounds: "-", "+", "[bytes" or "(bytes"
    high: bytes
    descending: bool
    limit: int
    after: Optional[bytes]  # the cursor's entry

    def bounds(self) -> Tuple[bytes, bytes]:
        """The range this page reads: the query's, narrowed by the cursor (never widened by it)."""
        low, high = self.low, self.high
        if self.after is not None:
            if self.descending and _below(b"(" + self.after, high):
                high = b"(" + self.after
            elif not self.descending and _above(b"(" + self.after, low):
                low = b"(" + self.after
        return low, high


def _above(candidate: bytes, current: bytes) -> bool:
    """Whether lower bound ``candidate`` (exclusive) is at or above lower bound ``current``."""
    if current == b"-":
        return True
    if current == b"+":
        return False
    return candidate[1:] >= current[1:]


def _below(candidate: bytes, current: bytes) -> bool:
    """Whether upper bound ``candidate`` (exclusive) is at or below upper bound ``current``."""
    if current == b"+":
        return True
    if current == b"-":
        return False
    return candidate[1:] <= current[1:]


def within(entry: bytes, low: bytes, high: bytes) -> bool:
    """Whether ``ZRANGEBYLEX key low high`` would list ``entry`` ("[x" inclusive, "(x" exclusive, "-", "+")."""
    above = low == b"-" or (low != b"+" and (entry > low[1:] or (low[:1] == b"[" and entry == low[1:])))
    below = high == b"+" or (high != b"-" and (entry < high[1:] or (high[:1] == b"[" and entry == high[1:])))
    return above and below


def filters_of(arguments: Dict[str, List[str]], fields: Collection[str], own: Collection[str]) -> Dict[str, List[str]]:
    """The arguments that make a request a query: ``order``, each named like a declared field (``fields``), and
    each whose values look like ``op.value``, an operator Jetway does not know included (``neq.5``).

    ``plan`` refuses what it cannot apply, so a typo is a 400, never the whole
    collection answered unfiltered. ``own``: the operation's own parameters
    (``limit``, ``cursor``, ...), never filters. Other arguments stay ignored,
    as they were before queries (a browser's cache-busting ``_=...``).
    """
    filters = {
        name: values
        for name, values in arguments.items()
        if name not in own
        and name != "order"
        and (name in fields or any(_LOOKS_LIKE_A_FILTER.match(value) for value in values))
    }
    if "order" in arguments:
        filters["order"] = arguments["order"]
    return filters


def field_names(indexes: Sequence[Index]) -> FrozenSet[str]:
    """The names a query calls the fields of ``indexes`` by."""
    return frozenset(field.name for index in indexes for field in index.fields)


def plan(indexes: Sequence[Index], arguments: Dict[str, List[str]], limit: int, cursor: Optional[str]) -> Query:
    """The query the request's filters ask (``filters_of``), planned onto an index.

    An operator Jetway does not know is ``QueryError`` whatever the field; a
    field no index has, ``NoIndex``.
    """
    fields = {field.name: field for index in indexes for field in index.fields}
    equal: Dict[str, Any] = {}
    ranges: Dict[str, Dict[str, Any]] = {}
    for name, values in arguments.items():
        if name == "order":
            continue
        parsed = []
        for text in values:
            operator, dot, raw = text.partition(".")
            if operator not in OPERATORS or not dot:
                raise QueryError(f"{name}={text[:60]}: a filter is op.value, op one of {', '.join(OPERATORS)}")
            parsed.append((operator, raw))
        field = fields.get(name)
        if field is None:
            raise NoIndex(_no_field(name, indexes))
        for operator, raw in parsed:
            value = _typed(field, raw)
            if operator == "eq":
                if name in equal and equal[name] != value:
                    raise QueryError(f"{name} is asked to equal two values")
                equal[name] = value
            else:
                side = "low" if operator in ("gt", "gte") else "high"
                if side in ranges.setdefault(name, {}):
                    raise QueryError(f"{name} has two {'lower' if side == 'low' else 'upper'} bounds")
                ranges[name][side] = (operator, value)
    order, descending = _order(arguments.get("order"), fields)
    ranged = set(ranges) - set(equal)
    if len(ranged) > 1:
        raise QueryError(f"a range on one field at a time: {', '.join(sorted(ranged))}")
    both = set(ranges) & set(equal)
    if both:
        raise QueryError(f"{min(both)} has eq and a range; use one")
    following = next(iter(ranged), None)
    if order is not None and following is not None and order != following:
        raise QueryError(f"the order ({order}) must be on the ranged field ({following})")
    following = following or order
    if following in equal:
        following = None  # ordered by a field that is fixed: the index's next fields, then id
    index = _choose(indexes, set(equal), following)
    if index is None:
        raise NoIndex(_suggest(fields, list(equal), following))
    prefix = b"".join(_encoded(field, equal[field.name]) for field in index.fields[: len(equal)])
    low, high = _bounds(index, prefix, len(equal), ranges.get(following or "", {}))
    return Query(index, low, high, descending, limit, decode_cursor(cursor))


def _choose(indexes: Sequence[Index], equal: set, following: Optional[str]) -> Optional[Index]:
    fitting = []
    for index in indexes:
        names = [field.name for field in index.fields]
        if set(names[: len(equal)]) != equal:
            continue
        if following is not None and (len(names) <= len(equal) or names[len(equal)] != following):
            continue
        fitting.append(index)
    return min(fitting, key=lambda index: (len(index.fields), index.name), default=None)


def _bounds(index: Index, prefix: bytes, fixed: int, ranged: Dict[str, Any]) -> Tuple[bytes, bytes]:
    """The ``ZRANGEBYLEX`` bounds of the entries that start with ``prefix`` and whose next value is in range."""
    low = b"[" + prefix if prefix else b"-"
    end = prefix_end(prefix) if prefix else None
    high = b"(" + end if end is not None else b"+"
    if "low" in ranged:
        low = _bound(index.fields[fixed], prefix, *ranged["low"], inclusive="gte", past=b"[")
    if "high" in ranged:
        high = _bound(index.fields[fixed], prefix, *ranged["high"], inclusive="lt", past=b"(")
    return low, high


def _bound(field: IndexField, prefix: bytes, operator: str, value: Any, inclusive: str, past: bytes) -> bytes:
    """One side's bound: at the value's entries (``gte`` from them, ``lt`` below them), or past all of them
    (``gt``, ``lte``: from, or below, the first bytes after every entry that starts with the value)."""
    encoded = prefix + _encoded(field, value)
    if operator == inclusive:
        return b"[" + encoded if operator == "gte" else b"(" + encoded
    after = prefix_end(encoded)
    return past + after if after is not None else b"+"


def _encoded(field: IndexField, value: Any) -> bytes:
    encoded = encode(value, field.type)
    if encoded is None:
        raise QueryError(
            f"{field.name}: {json.dumps(value)[:60]} cannot be in the index (a string of more than"
            f" {MAX_STRING_BYTES} bytes, or a number of 2**53 or more)"
        )
    return encoded


def _typed(field: IndexField, raw: str) -> Any:
    if field.type == NUMBER:
        if not _NUMBER.match(raw):
            raise QueryError(f"{field.name} is a number field: {raw[:40]!r} is not a JSON number")
        return json.loads(raw)
    if field.type == BOOLEAN:
        if raw not in ("true", "false"):
            raise QueryError(f"{field.name} is a boolean field: true or false, not {raw[:40]!r}")
        return raw == "true"
    return raw


def _order(values: Optional[List[str]], fields: Dict[str, IndexField]) -> Tuple[Optional[str], bool]:
    if not values:
        return None, False
    if len(values) > 1:
        raise QueryError("one order at a time")
    name, _, direction = values[0].rpartition(".")
    if direction not in ("asc", "desc") or not name:
        name, direction = values[0], "asc"
    if name not in fields:
        raise QueryError(f"order: {name[:40]} is not a field of this collection's indexes")
    return name, direction == "desc"


def _no_field(name: str, indexes: Sequence[Index]) -> str:
    known = sorted({field.name for index in indexes for field in index.fields})
    return (
        f"no index has a field {name[:40]}"
        + (f" (the fields are {', '.join(known)})" if known else " (the collection declares no index)")
        + f'; declare one in the collection\'s settings: "indexes": {{"by_{name[:40]}": {{"fields":'
        f' [{{"name": "{name[:40]}", "pointer": "/{name[:40]}", "type": "string"}}]}}}}'
    )


def _suggest(fields: Dict[str, IndexField], equal: List[str], following: Optional[str]) -> str:
    wanted = [*sorted(equal), *([following] if following else [])]
    described = ", ".join(
        f'{{"name": "{name}", "pointer": "{fields[name].pointer}", "type": "{fields[name].type}"}}' for name in wanted
    )
    return (
        f"no declared index answers this query: one whose fields start with {', '.join(wanted)}"
        f' would; declare it in the collection\'s settings: "indexes": {{"by_{"_".join(wanted)}":'
        f' {{"fields": [{described}]}}}}'
    )


def decode_cursor(text: Optional[str]) -> Optional[bytes]:
    """The entry a cursor continues after (``handlers.http.validation.encode_cursor`` made it): any bytes."""
    if text is None:
        return None
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise QueryError(f"cursor {text[:60]!r} is not one this API made") from None


@dataclass
class Found:
    """A page of a query: its documents' bodies in order, and the entry to continue after (None: the end).

    ``oversize``: the page could not start, its first document being more
    than a shard's share of the budget: read that entry alone.
    """

    bodies: List[bytes]
    last: Optional[bytes]
    oversize: Optional[bytes] = None
    entries: List[bytes] = field(default_factory=list)  # each body's entry (the id at its end: ``id_of``)


# Pages read again when their first document was too large for a shard's share and changed before it was read.
_ATTEMPTS = 3


@defer.inlineCallbacks
def run(link: Link, collection: bytes, query: Query, budget: int) -> Any:
    """The page ``query`` asks of ``collection``, within ``budget`` bytes of bodies; ``IndexNotReady`` while built."""
    low, high = query.bounds()
    for _ in range(_ATTEMPTS):
        page = yield _read(link, collection, query, low, high, query.limit, budget // keys.INDEX_SHARDS, budget)
        if page.oversize is None:
            return page
        # Alone, with the whole budget (no document is larger: api.config), in its own shard.
        entry = page.oversize
        single = b"[" + entry
        shard = keys.shard_of(id_of(entry, query.index.kinds()))
        alone = yield _read(link, collection, query, single, single, 1, budget, budget, [shard])
        if alone.bodies:
            return Found(alone.bodies, entry, None, alone.entries)
    raise WriteConflict()


def _read(
    link: Link,
    collection: bytes,
    query: Query,
    low: bytes,
    high: bytes,
    limit: int,
    share: int,
    budget: int,
    shards: Optional[List[int]] = None,
) -> defer.Deferred:
    index = query.index
    name, version = index.name.encode(), index.version.encode()
    commands = [
        QUERY.call(
            [keys.index_spec_key(collection, shard), keys.index_entries_key(collection, shard, name, version)],
            [
                name,
                version,
                low,
                high,
                b"1" if query.descending else b"0",
                limit,
                max(share, 1),
                index.kinds(),
                limit + _LOOK_AHEAD,
            ],
        )
        for shard in (range(keys.INDEX_SHARDS) if shards is None else shards)
    ]
    return link.pipeline_outcomes(commands, [QUERY]).addCallback(_merged, query, limit, budget)


def _merged(outcomes: List[Tuple[bool, Any]], query: Query, limit: int, budget: int) -> Found:
    answers = []
    for ok, reply in outcomes:
        if not ok:
            raise reply
        answers.append(reply)
    unready = [answer for answer in answers if answer[0] in (b"missing", b"building")]
    if unready:
        raise IndexNotReady(query.index.name, len(answers) - len(unready), len(answers))
    descending = query.descending

    def before(a: bytes, b: bytes) -> bool:  # a comes before b in the page's order
        return a > b if descending else a < b

    # Where the page must end: the first place a shard stopped with more to give (a shard whose
    # last entry came without its body, over its share, stopped just before it).
    stop: Optional[bytes] = None
    stop_inclusive = True
    shards: List[List[Tuple[bytes, Optional[bytes]]]] = []
    for state, position, *rest in answers:
        shards.append([(rest[at], rest[at + 1]) for at in range(0, len(rest), 3)])
        if state == b"end":
            continue
        inclusive = not (rest and rest[-3] == position and rest[-2] is None)
        if stop is None or before(position, stop) or (position == stop and not inclusive):
            stop, stop_inclusive = position, inclusive
    # Each shard's entries come in the page's order: merged, as a list page's ids are (cache.documents.pages).
    found = heapq.merge(*shards, key=lambda pair: pair[0], reverse=descending)
    bodies: List[bytes] = []
    entries: List[bytes] = []
    last: Optional[bytes] = None
    spent = 0
    for entry, body in found:
        if stop is not None and (before(stop, entry) or (entry == stop and not stop_inclusive)):
            break  # past where a shard stopped: the next page's
        if body is None or spent + len(body) > budget:
            if last is None:
                return Found([], None, entry)
            break
        bodies.append(body)
        entries.append(entry)
        spent += len(body)
        last = entry
        if len(bodies) == limit:
            return Found(bodies, last, None, entries)
    else:
        # Everything up to the stop is here: the next page starts after the stop (a shard may have looked
        # past stale entries only), or there is none.
        return Found(bodies, stop, None, entries)
    if last is None and stop is not None:
        # Nothing before the stop: its entry comes alone (over a shard's share), or a shard looked past
        # stale entries only and the next page starts after where it stopped.
        return Found([], None, stop) if not stop_inclusive else Found([], stop)
    return Found(bodies, last, None, entries)
