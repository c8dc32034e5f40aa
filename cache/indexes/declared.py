"""A collection's declared indexes: the ``indexes`` member of its settings, checked, and their spec for Redis.

In the settings (``PUT /v1/_collections/{coll}``)::

    "indexes": {
      "by_email": {"fields": [{"name": "email", "pointer": "/email", "type": "string"}]},
      "by_customer_date": {"fields": [
        {"name": "customer", "pointer": "/customer/id", "type": "string"},
        {"name": "created_at", "pointer": "/created_at", "type": "string"}]}
    }

An index lists the documents by its fields' values, in the fields' order,
then by id (``cache.indexes.values``); equality on a prefix of its fields and
a range or an order on the next one is what a query can ask of it
(``cache.indexes.queries``). A field's ``name`` is what a query calls it
(``?email=eq.a@example.com``), so one name means one pointer and one type
across a collection's indexes, and names the query string uses for itself
are refused.

A field of type ``string[]`` or ``number[]`` is over an array of strings or
numbers: each distinct element is an entry (``cache.indexes.values``), and
a query asks for the documents whose array holds a value with ``cs.{x}``
(``cache.indexes.filters``). An index has at most one array field, placed
anywhere among its fields (``{tags: string[], created_at: string}``: the
documents tagged x, by date); its version starts with ``m``.

An index's ``version`` is a digest of its fields' pointers and types: a
settings PUT that keeps an index as it was keeps its entries; one that
changes what it lists makes a new version, whose entries are built anew.
Each index shard holds the spec of the indexes it keeps (``SPEC_FIELDS``,
``spec_json``): the writes' scripts read it, so an entry is written in the
same script as its document, whatever a worker's settings cache says.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from cache.indexes.values import (
    BOOLEAN,
    MULTI_VERSION,
    NUMBER,
    NUMBER_ARRAY,
    STRING,
    STRING_ARRAY,
    TYPES,
    TooManyElements,
    entry,
    pointer_tokens,
)

MAX_INDEXES = 8
MAX_FIELDS = 3
_INDEX_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# Query parameters with a meaning of their own: no field may be called so.
RESERVED = frozenset({"limit", "cursor", "ids", "order", "ttl"})
# One letter per type in the spec the scripts read.
TYPE_LETTERS = {STRING: "s", NUMBER: "n", BOOLEAN: "b", STRING_ARRAY: "s", NUMBER_ARRAY: "n"}


class IndexDeclarationError(ValueError):
    """Declared indexes that cannot be stored; the message says which and why."""


# Compared and hashed by identity (eq=False): ``index_args`` finds an index list's digest by it on every write,
# and hashing the fields' nested tuples each time cost a few µs.
@dataclass(frozen=True, eq=False)
class IndexField:
    name: str
    pointer: str
    tokens: Tuple[str, ...]
    type: str

    @property
    def array(self) -> bool:
        """Whether the field is over an array (``string[]``, ``number[]``): each element an entry."""
        return self.type.endswith("[]")

    @property
    def element(self) -> str:
        """The type of the field's values (an array field's elements')."""
        return self.type[:-2] if self.array else self.type


@dataclass(frozen=True, eq=False)
class Index:
    name: str
    fields: Tuple[IndexField, ...]

    @property
    def version(self) -> str:
        """A digest of what the index lists: its fields' pointers and types, in order."""
        described = json.dumps([[field.pointer, field.type] for field in self.fields]).encode()
        digest = hashlib.sha1(described).hexdigest()
        return MULTI_VERSION + digest[:11] if self.multi else digest[:12]

    @property
    def multi(self) -> bool:
        """Whether the index has an array field: many entries per document, packed in its field."""
        return any(field.array for field in self.fields)

    def spec(self) -> Dict[str, Any]:
        """What an index shard keeps of it for the scripts: name, version, each field's type letter and tokens
        (and 1 for an array field)."""
        return {
            "n": self.name,
            "v": self.version,
            "f": [_field_spec(field) for field in self.fields],
        }

    def kinds(self) -> str:
        """The fields' type letters: how a script finds where an entry's id begins."""
        return "".join(TYPE_LETTERS[field.type] for field in self.fields)


def _field_spec(field: IndexField) -> List[Any]:
    """A field in the spec: its type letter, its tokens, and a third member, 1, for an array field."""
    described: List[Any] = [TYPE_LETTERS[field.type], list(field.tokens)]
    return [*described, 1] if field.array else described


def declared_indexes(value: Any) -> Tuple[Index, ...]:
    """The ``indexes`` member of settings, checked; ``IndexDeclarationError`` says what is wrong."""
    if not isinstance(value, dict):
        raise IndexDeclarationError('indexes must be an object: {"<index name>": {"fields": [...]}, ...}')
    if len(value) > MAX_INDEXES:
        raise IndexDeclarationError(f"a collection has at most {MAX_INDEXES} indexes, not {len(value)}")
    indexes: List[Index] = []
    fields_by_name: Dict[str, IndexField] = {}
    for name, declared in value.items():
        if not _INDEX_NAME.match(name):
            raise IndexDeclarationError(
                f"index name {name[:40]!r}: a lowercase letter, then up to 31 of a-z, 0-9 and _"
            )
        if not isinstance(declared, dict) or set(declared) != {"fields"} or not isinstance(declared["fields"], list):
            raise IndexDeclarationError(f'index {name}: an object with one member, "fields", an array')
        if not 1 <= len(declared["fields"]) <= MAX_FIELDS:
            raise IndexDeclarationError(f"index {name}: from 1 to {MAX_FIELDS} fields")
        fields = tuple(_field(name, field) for field in declared["fields"])
        if len({field.name for field in fields}) < len(fields):
            raise IndexDeclarationError(f"index {name}: a field appears twice")
        if sum(field.array for field in fields) > 1:
            raise IndexDeclarationError(f"index {name}: at most one field of an index is an array (string[], number[])")
        for field in fields:
            known = fields_by_name.setdefault(field.name, field)
            if (known.pointer, known.type) != (field.pointer, field.type):
                raise IndexDeclarationError(
                    f"field {field.name} is {known.pointer} ({known.type}) in one index and {field.pointer}"
                    f" ({field.type}) in another: a query names a field, so a name has one meaning"
                )
        indexes.append(Index(name, fields))
    return tuple(indexes)


def _field(index: str, declared: Any) -> IndexField:
    if not isinstance(declared, dict) or set(declared) != {"name", "pointer", "type"}:
        raise IndexDeclarationError(f'index {index}: each field is {{"name": ..., "pointer": ..., "type": ...}}')
    name, pointer, kind = declared["name"], declared["pointer"], declared["type"]
    if not isinstance(name, str) or not _FIELD_NAME.match(name) or name in RESERVED:
        raise IndexDeclarationError(
            f"index {index}: field name {str(name)[:40]!r}: a letter or _, then up to 63 letters, digits or _,"
            f" and none of {', '.join(sorted(RESERVED))}"
        )
    if not isinstance(pointer, str) or len(pointer) > 256:
        raise IndexDeclarationError(
            f"index {index}: field {name}'s pointer must be a JSON Pointer of up to 256 characters"
        )
    try:
        tokens = pointer_tokens(pointer)
    except ValueError as error:
        raise IndexDeclarationError(f"index {index}: field {name}: {error}") from None
    if kind not in TYPES:
        raise IndexDeclarationError(f"index {index}: field {name}'s type is one of {', '.join(TYPES)}")
    return IndexField(name, pointer, tokens, kind)


def spec_json(indexes: Tuple[Index, ...]) -> bytes:
    """The indexes as the shards' spec lists them (their build state is the shard's own)."""
    return json.dumps([index.spec() for index in indexes], separators=(",", ":")).encode()


# A write's index arguments when its collection declares none: no entries, and no digest to match.
NO_INDEX_ARGS: Tuple[Any, ...] = (0, b"")


@functools.lru_cache(maxsize=256)
def _described(indexes: Tuple[Index, ...]) -> Tuple[bytes, Tuple[Tuple[bytes, Any], ...]]:
    """The spec's digest (as the shards keep it: ``redis.sha1hex`` of the spec) and each index's field and fields."""
    digest = hashlib.sha1(spec_json(indexes)).hexdigest().encode()
    fields = tuple(
        (b"x:%s:%s" % (index.name.encode(), index.version.encode()), [(f.tokens, f.type) for f in index.fields])
        for index in indexes
    )
    return digest, fields


def index_args(indexes: Tuple[Index, ...], document: Any, doc_id: bytes) -> Tuple[Any, ...]:
    """A write's entries, computed here from the parsed ``document``, with the digest of the indexes they are of.

    The write's script uses them when its shard's spec has that digest (the
    worker's settings are the shard's), and computes the entries itself
    otherwise: Redis decoding the spec and the body and encoding each value
    was a large share of a create with three indexes (``loadtest/studies/_queries.py``;
    docs/history/performance.md, "Queries over declared indexes").
    """
    if not indexes:
        return NO_INDEX_ARGS
    digest, fields = _described(indexes)
    args: List[Any] = [len(fields), digest]
    for field, described in fields:
        try:
            args += (field, entry(document, described, doc_id) or b"")
        except TooManyElements:
            # Left to Redis (no digest matches ""), whose script refuses it as it refuses a body it cannot read:
            # one refusal (422 not-indexable) for every entry point, a batch's and an import's included.
            return (len(fields), b"", *(part for field, _ in fields for part in (field, b"")))
    return tuple(args)
