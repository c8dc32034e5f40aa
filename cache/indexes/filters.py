"""A query's filters as a request writes them: which arguments are filters, and each one's operator and values.

PostgREST's syntax, where users know it: ``?field=op.value``, the value
read as the field's declared type (``cache.indexes.declared``): a string
field takes the text as it is (``?email=eq.42`` asks for the string "42"),
a number field a JSON number, a boolean field ``true`` or ``false``.

- ``eq``, ``gt``, ``gte``, ``lt``, ``lte``: one value.
- ``in``: ``in.(a,b,c)``, 1 to ``MAX_IN_VALUES`` values, each read as the
  field's type. A value that holds a comma, a parenthesis, a double quote
  or a backslash is written in double quotes, with ``\\"`` and ``\\\\`` inside
  (``in.("a,b",c)``), as PostgREST reads them; ``in.("")`` is the empty string.
- ``like``: a string field's prefix, ``like.abc*``: the text before one
  trailing ``*``, which is all ``like`` takes (no ``*`` elsewhere, no ``%``):
  a range of the index, in its order.
- ``cs``: an array field's (``string[]``, ``number[]``) one operator,
  ``cs.{x}``: the documents whose array holds ``x`` (PostgREST's "contains"),
  one value, read as the elements' type, written in double quotes as ``in``'s
  where it holds a comma, a brace, a double quote or a backslash
  (``cs.{"a,b"}``; ``cs.{""}`` is the empty string). An equality on the
  field's place in the index: each document once, its entry for ``x``.

Which arguments are filters (``filters_of``): every argument named like a
declared field, and every one whose value looks like ``op.value`` with any
lowercase word for ``op``; ``plan`` (``cache.indexes.queries``) refuses
what it cannot apply, so a typo (``score=neq.5``) is a 400 naming the
operators, never the whole collection answered unfiltered. The operation's
own parameters are never filters, and other arguments stay ignored (a
browser's cache-busting ``_=...``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Collection, Dict, FrozenSet, List, Sequence, Tuple

from cache.indexes.declared import Index, IndexField
from cache.indexes.values import BOOLEAN, NUMBER, STRING

OPERATORS = ("eq", "gt", "gte", "lt", "lte", "in", "like", "cs")
# The most values one ``in`` takes: each is a range read from every shard (cache.indexes.queries.run).
MAX_IN_VALUES = 20
# A value that looks like a filter's ``op.value``, whether Jetway knows the operator or not (``neq.5``).
_LOOKS_LIKE_A_FILTER = re.compile(r"[a-z]+\.")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?\Z")


class QueryError(ValueError):
    """A query that cannot be asked as written (maps to 400 ``invalid-query``); the message says why."""


@dataclass(frozen=True)
class Filter:
    """One filter on a field: its operator and its values, typed (one; ``in``'s in the order written)."""

    operator: str
    values: Tuple[Any, ...]


def filters_of(arguments: Dict[str, List[str]], fields: Collection[str], own: Collection[str]) -> Dict[str, List[str]]:
    """The arguments that make a request a query: ``order``, each named like a declared field (``fields``), and
    each whose values look like ``op.value``, an operator Jetway does not know included (``neq.5``).

    ``own``: the operation's own parameters (``limit``, ``cursor``, ...), never filters.
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


def operator_of(name: str, text: str) -> Tuple[str, str]:
    """``text``'s operator and the rest; ``QueryError`` naming the operators when it has none Jetway knows."""
    operator, dot, raw = text.partition(".")
    if operator not in OPERATORS or not dot:
        raise QueryError(f"{name}={text[:60]}: a filter is op.value, op one of {', '.join(OPERATORS)}")
    return operator, raw


def parse(field: IndexField, operator: str, raw: str) -> Filter:
    """The filter ``operator`` (one of ``OPERATORS``) with the text after its dot, typed by ``field``."""
    if field.array or operator == "cs":
        return Filter("cs", (typed(field, contained(field, operator, raw)),))
    if operator == "in":
        texts = in_list(field.name, raw)
        return Filter(operator, tuple(typed(field, text) for text in texts))
    if operator == "like":
        return Filter(operator, (prefix(field, raw),))
    return Filter(operator, (typed(field, raw),))


def prefix(field: IndexField, raw: str) -> str:
    """The prefix ``like.<prefix>*`` asks for, on a string field; ``QueryError`` naming what ``like`` takes."""
    supported = f"{field.name}=like.abc* (a prefix, then one * at the end; no * elsewhere, no %)"
    if field.type != STRING:
        raise QueryError(f"{field.name} is a {field.type} field: like is for string fields: {supported}")
    if not raw.endswith("*") or "*" in raw[:-1] or "%" in raw:
        raise QueryError(f"{field.name}=like.{raw[:60]}: like takes a prefix only: {supported}")
    return raw[:-1]


def contained(field: IndexField, operator: str, raw: str) -> str:
    """The one value of ``cs.{x}`` on an array field; ``QueryError`` naming what an array field takes."""
    supported = f"{field.name}=cs.{{x}} (the documents whose array holds x: one value, quoted as in's are)"
    if not field.array:
        raise QueryError(f"{field.name} is a {field.type} field: cs is for array fields ({field.name}[]): {supported}")
    if operator != "cs":
        raise QueryError(f"{field.name} is a {field.type} field: {operator} is not for it, only {supported}")
    if len(raw) < 2 or raw[0] != "{" or raw[-1] != "}":
        raise QueryError(f"{field.name}=cs.{raw[:60]}: {supported}")
    body = raw[1:-1]
    if body[:1] == '"':
        value, end = _quoted(body, 1)
        if end != len(body):
            raise QueryError(f"{field.name}=cs.{raw[:60]}: one value, its quotes around all of it: {supported}")
        return value
    if any(char in body for char in ',{}"\\') or body == "":
        raise QueryError(f'{field.name}=cs.{raw[:60]}: one value; quote one that holds , {{ }} " or \\: {supported}')
    return body


def in_list(name: str, raw: str) -> List[str]:
    """The values of ``in.(...)``, as PostgREST reads them: comma-separated, double quotes around a value that
    holds a comma, a parenthesis, a double quote or a backslash, ``\\`` escaping the next character inside."""
    usage = f'{name}=in.(a,b,...): 1 to {MAX_IN_VALUES} values, "quoted" where one holds , ( ) " or \\'
    if len(raw) < 3 or raw[0] != "(" or raw[-1] != ")":
        raise QueryError(f"{name}=in.{raw[:60]}: {usage}")
    body, values, at = raw[1:-1], [], 0
    while True:
        if len(values) == MAX_IN_VALUES:
            raise QueryError(f"{name}=in.(...) has more than {MAX_IN_VALUES} values: {usage}")
        if body[at : at + 1] == '"':
            value, at = _quoted(body, at + 1)
            if at is None or (at < len(body) and body[at] != ","):
                raise QueryError(f"{name}=in.{raw[:60]}: a quoted value ends with a quote, then a comma: {usage}")
        else:
            end = body.find(",", at)
            end = len(body) if end < 0 else end
            value = body[at:end]
            if any(char in value for char in '"()'):
                raise QueryError(f'{name}=in.{raw[:60]}: {value[:40]!r} holds " ( or ): quote it. {usage}')
            at = end
        values.append(value)
        if at >= len(body):
            return values
        at += 1  # the comma


def _quoted(body: str, at: int) -> Tuple[str, Any]:
    """The quoted value that starts at ``at`` (past its opening quote), and where it ends (None: it does not)."""
    out = []
    while at < len(body):
        char = body[at]
        if char == "\\" and at + 1 < len(body):
            out.append(body[at + 1])
            at += 2
        elif char == '"':
            return "".join(out), at + 1
        else:
            out.append(char)
            at += 1
    return "", None


def typed(field: IndexField, raw: str) -> Any:
    """``raw`` read as ``field``'s declared type (an array field's elements')."""
    if field.element == NUMBER:
        if not _NUMBER.match(raw):
            raise QueryError(f"{field.name} is a number field: {raw[:40]!r} is not a JSON number")
        return json.loads(raw)
    if field.element == BOOLEAN:
        if raw not in ("true", "false"):
            raise QueryError(f"{field.name} is a boolean field: true or false, not {raw[:40]!r}")
        return raw == "true"
    return raw
