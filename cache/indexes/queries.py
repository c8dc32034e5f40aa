"""Queries over declared indexes: the filters of a request planned onto an index, then read from every shard.

Syntax (``cache.indexes.filters``): ``?field=op.value`` for each filter,
``op`` one of ``eq``, ``gt``, ``gte``, ``lt``, ``lte``, ``in``, ``like``
(a string's prefix) or ``cs`` (an array field holds a value), a field named
by the collection's declared indexes (``cache.indexes.declared``), its value
read as that field's type; ``order=field.asc`` or ``.desc``; ``limit`` and
``cursor`` as list pages have them. Several filters are ANDed: equality
(``eq``, or ``in`` on one of those fields) on some fields, and a range (up to
one lower and one upper bound) and/or an order on one more.

Planning: an index answers when its first fields are exactly the equality
filters' (in any order in the query) and, with a range or an order, its
next field is that one. The entries' bytes (``cache.indexes.values``) then
make the query one ``ZRANGEBYLEX`` range: the equality values' bytes as a
prefix, the range's bounds after it. An ``in`` makes one such range per
value (``Range``); they are disjoint, and their entries are answered
merged in the order of what follows the value (the next fields, then the
id), as if that field too were fixed, unless the order is on the ``in``'s
field itself: then one value's entries after the other's, in the index's
order. No index answers: ``NoIndex``, whose message names the index to
declare. Never a scan. ``cs.{x}`` on an array field is an equality on its
place: the documents' entries for ``x``, one per document. An index with an
array field answers only a query with ``cs`` on it: any other would meet
each document once per element.

Reading it: ``cache.indexes.reads``. The cursor is the last answer's key
(base64url): its entry, past its range's lead for an ``in``
(``Query.key_of``), so it names the same place in every range. Any bytes
are a valid place to resume, clamped to each range, so a cursor from
another query cannot widen this one's.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cache.indexes.declared import Index, IndexField
from cache.indexes.filters import Filter, QueryError, operator_of, parse
from cache.indexes.values import MAX_STRING_BYTES, STRING_END, encode, prefix_end


class NoIndex(QueryError):
    """A query no declared index answers (maps to 400); the message names the index to declare."""


class IndexNotReady(Exception):
    """The index is being built (maps to 409 with ``Retry-After``); ``built`` shards of ``shards`` are."""

    def __init__(self, name: str, built: int, shards: int) -> None:
        super().__init__(f"index {name} is being built ({built} of {shards} shards done); retry shortly")
        self.name = name


@dataclass(frozen=True)
class Range:
    """One range of a query's entries, and the bytes before the part of each that orders the answer.

    ``lead``: an ``in`` value's prefix (the equality values' bytes with that
    value), so that the ranges of the values merge in the order of what
    follows it; empty otherwise (the entries' own order).
    """

    lead: bytes
    low: bytes  # ZRANGEBYLEX bounds: "-", "+", "[bytes" or "(bytes"
    high: bytes


@dataclass(frozen=True)
class Query:
    """A query planned onto an index: the ranges of its entries (one; one per value of an ``in``), and the
    order and page asked."""

    index: Index
    ranges: Tuple[Range, ...]
    descending: bool
    limit: int
    after: Optional[bytes]  # the cursor: the last answer's key (its entry past its range's lead)

    @property
    def low(self) -> bytes:
        """The lower bound of a one-range query (no ``in``)."""
        (only,) = self.ranges
        return only.low

    def bounds(self, at: int = 0) -> Tuple[bytes, bytes]:
        """The part of range ``at`` this page reads: the query's, narrowed by the cursor (never widened by it)."""
        lead, low, high = self.ranges[at].lead, self.ranges[at].low, self.ranges[at].high
        if self.after is not None:
            after = b"(" + lead + self.after
            if self.descending and _below(after, high):
                high = after
            elif not self.descending and _above(after, low):
                low = after
        return low, high

    def key_of(self, entry: bytes) -> bytes:
        """What orders ``entry`` among the answers, and what a cursor after it holds: the entry past its lead."""
        for range_ in self.ranges:
            if entry.startswith(range_.lead):
                return entry[len(range_.lead) :]
        return entry


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


def plan(indexes: Sequence[Index], arguments: Dict[str, List[str]], limit: int, cursor: Optional[str]) -> Query:
    """The query the request's filters ask (``cache.indexes.filters.filters_of``), planned onto an index.

    An operator Jetway does not know is ``QueryError`` whatever the field; a
    field no index has, ``NoIndex``.
    """
    fields = {field.name: field for index in indexes for field in index.fields}
    equal: Dict[str, Any] = {}
    choices: Dict[str, Tuple[Any, ...]] = {}  # an in's field: its values
    ranges: Dict[str, Dict[str, Any]] = {}
    for name, values in arguments.items():
        if name == "order":
            continue
        written = [operator_of(name, text) for text in values]
        field = fields.get(name)
        if field is None:
            raise NoIndex(_no_field(name, indexes))
        for operator, raw in written:
            _add(parse(field, operator, raw), name, equal, choices, ranges)
    order, descending = _order(arguments.get("order"), fields)
    if len(choices) > 1:
        raise QueryError(f"in on one field at a time: {', '.join(sorted(choices))}")
    fixed = {**equal, **{name: None for name in choices}}
    ranged = set(ranges) - set(fixed)
    if len(ranged) > 1:
        raise QueryError(f"a range on one field at a time: {', '.join(sorted(ranged))}")
    both = set(ranges) & set(fixed)
    if both:
        raise QueryError(f"{min(both)} has {'eq' if min(both) in equal else 'in'} and a range; use one")
    following = next(iter(ranged), None)
    if order is not None and following is not None and order != following:
        raise QueryError(f"the order ({order}) must be on the ranged field ({following})")
    following = following or order
    if following in fixed:
        following = None  # ordered by a field that is fixed: the index's next fields, then id
    index = _choose(indexes, set(fixed), following)
    if index is None:
        raise NoIndex(_suggest(fields, list(fixed), following))
    spans = []
    for prefix in _prefixes(index.fields[: len(fixed)], equal, choices):
        low, high = _bounds(index, prefix, len(fixed), ranges.get(following or "", {}))
        # The values of an in merge in the order of what follows them, unless the order is on the in's field.
        spans.append(Range(prefix if choices and order not in choices else b"", low, high))
    return Query(index, tuple(spans), descending, limit, decode_cursor(cursor))


def _add(
    given: Filter,
    name: str,
    equal: Dict[str, Any],
    choices: Dict[str, Tuple[Any, ...]],
    ranges: Dict[str, Dict[str, Any]],
) -> None:
    """One filter on field ``name`` added to the query's equalities, ``in`` values and ranges."""
    if given.operator == "cs":  # an equality on the array field's place in the index
        if name in equal:
            raise QueryError(f"{name}=cs.{{x}} once: one value an array must hold, not two")
        equal[name] = given.values[0]
    elif given.operator == "eq":
        value = given.values[0]
        if name in equal and equal[name] != value:
            raise QueryError(f"{name} is asked to equal two values")
        if name in choices:
            raise QueryError(f"{name} has eq and in; use one")
        equal[name] = value
    elif given.operator == "in":
        if name in choices:
            raise QueryError(f"{name} has two in lists; give one")
        if name in equal:
            raise QueryError(f"{name} has eq and in; use one")
        choices[name] = given.values
    elif given.operator == "like":
        if ranges.get(name):
            raise QueryError(f"{name} has like and another bound; like is a range of its own")
        ranges[name] = {"like": given.values[0]}
    else:
        if "like" in ranges.get(name, {}):
            raise QueryError(f"{name} has like and another bound; like is a range of its own")
        side = "low" if given.operator in ("gt", "gte") else "high"
        if side in ranges.setdefault(name, {}):
            raise QueryError(f"{name} has two {'lower' if side == 'low' else 'upper'} bounds")
        ranges[name][side] = (given.operator, given.values[0])


def _prefixes(fixed: Sequence[IndexField], equal: Dict[str, Any], choices: Dict[str, Tuple[Any, ...]]) -> List[bytes]:
    """The bytes the entries start with: the equality values' (one), or with each distinct value of the in,
    in their order in the index (two values of one encoding, 1 and 1.0, are one range)."""
    prefixes = {b""}
    for fixed_field in fixed:
        values = choices.get(fixed_field.name, (equal.get(fixed_field.name),))
        prefixes = {prefix + _encoded(fixed_field, value) for prefix in prefixes for value in values}
    return sorted(prefixes)


def _choose(indexes: Sequence[Index], equal: set, following: Optional[str]) -> Optional[Index]:
    fitting = []
    for index in indexes:
        names = [field.name for field in index.fields]
        if set(names[: len(equal)]) != equal:
            continue
        if any(field.array and field.name not in equal for field in index.fields):
            continue  # its documents are there once per element: only cs on that field finds each once
        if following is not None and (len(names) <= len(equal) or names[len(equal)] != following):
            continue
        fitting.append(index)
    return min(fitting, key=lambda index: (len(index.fields), index.name), default=None)


def _bounds(index: Index, prefix: bytes, fixed: int, ranged: Dict[str, Any]) -> Tuple[bytes, bytes]:
    """The ``ZRANGEBYLEX`` bounds of the entries that start with ``prefix`` and whose next value is in range."""
    if "like" in ranged:  # the entries whose value starts with the text: its encoding but the terminator
        prefix += _encoded(index.fields[fixed], ranged["like"])[: -len(STRING_END)]
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
    encoded = encode(value, field.element)
    if encoded is None:
        raise QueryError(
            f"{field.name}: {json.dumps(value)[:60]} cannot be in the index (a string of more than"
            f" {MAX_STRING_BYTES} bytes, or a number of 2**53 or more)"
        )
    return encoded


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
    if fields[name].array:
        raise QueryError(f"order: {name[:40]} is an array field: it takes cs.{{x}} only, and orders nothing")
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
