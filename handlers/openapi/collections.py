"""``/openapi.json`` with each configured collection's schema, rebuilt when settings change.

A collection with a schema or declared indexes gets paths of its own,
``/v1/<coll>/{id}`` and ``/v1/<coll>``: the generic document and collection
operations with the collection's schema as the body of its writes (PUT,
POST), its indexes' fields as query parameters of its list
(``?email=eq.a@x``, each described with its pointer and type, and typed by
the collection's schema where it has one, ``member_schemas``; the
``order`` values listed), and operation ids that name it (``putUsersDocument``), so
generated clients get a type per collection. The generic paths stay for
every other collection.

What it costs: the document is serialized once and kept with the settings
cache's generation; a change (published by any worker or the CLI) bumps the
generation, and the next ``/openapi.json`` reads every collection's
settings (one ``ZRANGE`` and one pipelined read) and serializes again. While
the settings subscription is down nothing is kept: each request rebuilds.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from twisted.internet import defer

from cache.collection_settings import stored_indexes
from cache.indexes.declared import Index, IndexField
from cache.indexes.filters import MAX_IN_VALUES
from cache.indexes.values import STRING
from cache.json import codec
from cache.settings_cache import SettingsCache
from handlers.openapi.build import openapi_document
from handlers.openapi.member_schemas import member_schema, value_pattern
from handlers.openapi.parts import Json, parameter
from handlers.operation import Operation
from handlers.paths import COLLECTION

_SCHEMA_ONLY_KEYS = ("$schema", "$id")
# The body a collection's schema replaces (PUT, POST; a merge patch stays one).
_GENERIC_BODY = {"$ref": "#/components/schemas/Document"}


def camel(name: str) -> str:
    """``user-events_2`` -> ``UserEvents2``: an operation id part generators keep readable."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[-_]", name) if part)


def with_collections(base: Json, schemas: List[Tuple[str, Any]], indexes: Optional[Dict[str, Any]] = None) -> Json:
    """``base`` plus, for each ``(collection, schema)`` (schema None: none), its own typed copy of the paths under
    ``/v1/{collection}``; ``indexes``: each collection's declared indexes (``cache.indexes.declared``), by name."""
    spec = copy.deepcopy(base)
    generic = [path for path in spec["paths"] if path.startswith(COLLECTION)]
    taken = {name for name in spec["components"]["schemas"]}
    for collection, schema in schemas:
        component = _unique(camel(collection) + "Document", taken)
        taken.add(component)
        if schema is not None:
            spec["components"]["schemas"][component] = _as_component(schema, component, collection)
            ref = {"$ref": f"#/components/schemas/{component}"}
        else:
            ref = _GENERIC_BODY
        operation_part = component[: -len("Document")]
        for path in generic:
            typed = path.replace("{collection}", collection, 1)
            spec["paths"][typed] = _typed(spec["paths"][path], collection, ref, operation_part)
        declared = (indexes or {}).get(collection)
        if declared:
            _with_filters(spec["paths"][COLLECTION.replace("{collection}", collection, 1)], declared, schema)
    return spec


def _contains(name: str, field: IndexField) -> Json:
    """An array field's parameter: ``cs.{x}``, the documents whose array holds ``x`` (one value)."""
    value = r"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)" if field.element == "number" else r'([^,{}"\\]+|".*")'
    return parameter(
        name,
        "query",
        f"Filter on `{field.pointer}` ({field.type}): `cs.{{x}}`, the documents whose array holds `x` (one value;"
        ' `"a,b"` in double quotes where it holds a comma, a brace, a quote or a backslash). Each document once.',
        {"type": "array", "items": {"type": "string", "pattern": f"^cs\\.\\{{{value}\\}}$"}, "maxItems": 1},
        style="form",
        explode=True,
    )


def _with_filters(item: Json, indexes: Sequence[Index], schema: Any) -> None:
    """The list operation of a collection with declared indexes: a query parameter per field, typed by the
    collection's ``schema`` where it says what the member is (``member_schemas``), and ``order``'s values."""
    fields = {field.name: field for index in indexes for field in index.fields}
    listing = item["get"]
    listing["parameters"] = [p for p in listing.get("parameters", []) if not p.get("$ref", "").endswith("/order")]
    for name, field in sorted(fields.items()):
        if field.array:
            listing["parameters"].append(_contains(name, field))
            continue
        member = member_schema(schema, field.tokens) if schema is not None else None
        described = f"Filter on `{field.pointer}` ({field.type}"
        extra: Json = {}
        if member is not None:
            described += "; in the collection's schema: " + json.dumps(member, ensure_ascii=False)[:200]
            extra["x-value-schema"] = member
        listing["parameters"].append(
            parameter(
                name,
                "query",
                described + "): `op.value`, `op` one of eq, gt, gte, lt, lte; give it twice for a range"
                f' (`gte.` and `lt.`); or `in.(a,b)`, 1 to {MAX_IN_VALUES} values (`"a,b"` in double'
                " quotes where a value holds a comma, a parenthesis, a quote or a backslash)"
                + ("; or `like.abc*`: the strings that start with `abc`." if field.type == STRING else "."),
                {
                    "type": "array",
                    "items": {"type": "string", "pattern": value_pattern(field.type, member)},
                    "maxItems": 2,
                },
                style="form",
                explode=True,
                **extra,
            )
        )
    orders = [
        f"{name}.{direction}" for name in sorted(fields) for direction in ("asc", "desc") if not fields[name].array
    ]
    listing["parameters"].append(
        parameter("order", "query", "The query's order, on a field of the declared indexes.", {"enum": orders})
    )


def _unique(name: str, taken: Any) -> str:
    candidate, number = name, 2
    while candidate in taken:
        candidate, number = f"{name[: -len('Document')]}{number}Document", number + 1
    return candidate


def _as_component(schema: Any, component: str, collection: str) -> Any:
    """The collection's schema where OpenAPI wants it: local ``$ref``s re-rooted, no ``$schema``/``$id``."""
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    rooted = _reroot(schema, f"#/components/schemas/{component}")
    for key in _SCHEMA_ONLY_KEYS:
        rooted.pop(key, None)
    rooted.setdefault("description", f"A document of collection `{collection}`, as its schema requires.")
    return rooted


def _reroot(node: Any, root: str) -> Any:
    if isinstance(node, list):
        return [_reroot(item, root) for item in node]
    if not isinstance(node, dict):
        return node
    moved = {key: _reroot(value, root) for key, value in node.items()}
    ref = moved.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        moved["$ref"] = root + ref[1:]
    return moved


def _typed(generic: Json, collection: str, body_ref: Json, part: str) -> Json:
    """A copy of a generic path item for one collection: no ``collection`` parameter, typed document bodies."""
    item = copy.deepcopy(generic)
    item["description"] = (
        f"Collection `{collection}` (its settings give it a schema or indexes). " + item["description"]
    )
    item["parameters"] = [p for p in item.get("parameters", []) if not p["$ref"].endswith("/collection")]
    for operation in item.values():
        if not isinstance(operation, dict) or "operationId" not in operation:
            continue
        operation["operationId"] = _named(operation["operationId"], part)
        operation["tags"] = [collection]
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None and body["schema"] == _GENERIC_BODY and body_ref != _GENERIC_BODY:
            body["schema"] = body_ref
            operation["requestBody"]["description"] += f" It must match the schema of `{collection}`."
    return item


def _named(operation_id: str, part: str) -> str:
    """``putDocument`` -> ``putUsersDocument``; ``listDocuments`` -> ``listUsersDocuments``."""
    match = re.match(r"([a-z]+)(.*)", operation_id)
    assert match is not None
    return match.group(1) + part + match.group(2)


class OpenApiSource:
    """The served document's bytes: kept per settings generation, rebuilt after a change."""

    def __init__(
        self,
        operations: Sequence[Operation],
        max_ids: int,
        collections: Optional[SettingsCache],
        with_docs: bool = True,
        max_wait: int = 60,
    ) -> None:
        self._base = openapi_document(operations, max_ids, with_docs, max_wait)
        self._collections = collections
        self._kept: Optional[Tuple[int, bytes]] = None
        if collections is None:
            self._kept = (0, codec.dumps(self._base))

    def body(self) -> defer.Deferred:
        collections = self._collections
        if collections is None:
            assert self._kept is not None
            return defer.succeed(self._kept[1])
        generation = collections.generation
        if self._kept is not None and self._kept[0] == generation and collections.subscribed:
            return defer.succeed(self._kept[1])
        return collections.store.read_all().addCallback(self._rebuilt, generation)

    def _rebuilt(self, rows: List[Tuple[str, bytes, bytes]], generation: int) -> bytes:
        schemas, indexes = [], {}
        for name, settings, _etag in rows:
            schema = codec.loads(settings).get("schema")
            declared = stored_indexes(settings)
            if schema is not None or declared:
                schemas.append((name, schema))
            if declared:
                indexes[name] = declared
        body = codec.dumps(with_collections(self._base, schemas, indexes) if schemas else self._base)
        assert self._collections is not None
        if self._collections.subscribed and generation == self._collections.generation:
            self._kept = (generation, body)
        return body
