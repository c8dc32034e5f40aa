"""What a collection's JSON Schema says of the member an index field points at: the type of its queries' values.

A query's filter is ``field=op.value`` or ``field=in.(a,b)``
(``cache.indexes.filters``): the value is text, read as the field's declared type. Where the collection has a
schema, ``/openapi.json`` types that text from it: the member's schema is
found by walking the field's pointer through ``properties``, ``items`` and
``prefixItems`` (following local ``$ref`` and ``allOf``), and its
value-describing keywords (type, format, enum, bounds) are given with the
parameter, with a pattern that a generated client can check before it sends.
A schema that does not say (``additionalProperties``, ``oneOf``, a remote
``$ref``) types nothing: the declared type alone is given, as without a
schema.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence

from cache.indexes.filters import MAX_IN_VALUES

Json = Dict[str, Any]

# The keywords that describe a value (not a structure): what a query's value is shown with.
VALUE_KEYWORDS = (
    "type",
    "format",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "description",
)
# How deep a walk follows references and allOf's: a schema whose $refs loop ends here, untyped.
_MOST_STEPS = 64

_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_INTEGER = r"-?(0|[1-9][0-9]*)"
_OPERATORS = "(eq|gt|gte|lt|lte)"
# A string field's prefix: the text, then one * at the end (no other *, no %).
_LIKE = "like\\.[^*%]*\\*"


def member_schema(schema: Any, tokens: Sequence[str]) -> Optional[Json]:
    """The value-describing keywords of the member at ``tokens`` in ``schema``; None where the schema says none."""
    found = _walk(schema, schema, list(tokens), [0])
    if not isinstance(found, dict):
        return None
    described = {key: found[key] for key in VALUE_KEYWORDS if key in found}
    return described or None


def value_pattern(declared: str, member: Optional[Json]) -> str:
    """The pattern of ``op.value`` for a field of type ``declared`` (string, number, boolean), narrowed by what
    the member's schema says: an integer's digits, an enum's values; ``in.(a,b)`` with such values too, and a
    string field's prefix, ``like.abc*``."""
    if member is not None:
        choices = _choices(declared, member)
        if choices is not None:
            one = "|".join(re.escape(choice) for choice in choices)
            listed = "|".join(_listed(choice) for choice in choices)
            like = f"|{_LIKE}" if declared == "string" else ""
            return f"^({_OPERATORS}\\.({one})|{_in(listed)}{like})$"
    if declared == "boolean":
        return f"^(eq\\.(true|false)|{_in('true|false')})$"
    if declared == "number":
        integer = member is not None and member.get("type") == "integer"
        number = _INTEGER if integer else _NUMBER
        return f"^({_OPERATORS}\\.{number}|{_in(number)})$"
    return f"^({_OPERATORS}\\.|in\\.\\(.+\\)$|{_LIKE}$)"


def _in(value: str) -> str:
    """``in.(...)`` of 1 to ``MAX_IN_VALUES`` values, each matching ``value`` (an alternation)."""
    return f"in\\.\\(({value})(,({value})){{0,{MAX_IN_VALUES - 1}}}\\)"


def _listed(choice: str) -> str:
    """How ``choice`` may be written in an ``in``'s list: as it is, where nothing in it needs quotes, or quoted."""
    quoted = re.escape('"' + choice.replace("\\", "\\\\").replace('"', '\\"') + '"')
    if choice and not any(char in choice for char in ',()"\\'):
        return re.escape(choice) + "|" + quoted
    return quoted


def _choices(declared: str, member: Json) -> Optional[List[str]]:
    """An enum's (or const's) values of the declared type, as a query writes them; None when there is none."""
    values = member.get("enum", [member["const"]] if "const" in member else None)
    if not isinstance(values, list):
        return None
    kinds = {"string": str, "number": (int, float), "boolean": bool}
    kept = [v for v in values if isinstance(v, kinds[declared]) and (declared == "boolean" or not isinstance(v, bool))]
    if not kept:
        return None
    return [v if isinstance(v, str) else json.dumps(v) for v in kept]


def _walk(root: Any, node: Any, tokens: List[str], steps: List[int]) -> Any:
    """The subschema ``tokens`` lead to from ``node`` (``root``: where local ``$ref``s start); None: unknown."""
    steps[0] += 1
    if steps[0] > _MOST_STEPS or not isinstance(node, dict):
        return None
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        if target is None:
            return None
        node = {**target, **{key: value for key, value in node.items() if key != "$ref"}}
    if not tokens:
        return node
    token, rest = tokens[0], tokens[1:]
    child = _child(node, token)
    if child is not None:
        return _walk(root, child, rest, steps)
    for part in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
        found = _walk(root, part, tokens, steps)
        if found is not None:
            return found
    return None


def _child(node: Json, token: str) -> Any:
    properties = node.get("properties")
    if isinstance(properties, dict) and token in properties:
        return properties[token]
    if token.isdigit() and (token == "0" or not token.startswith("0")):
        prefix = node.get("prefixItems")
        if isinstance(prefix, list) and int(token) < len(prefix):
            return prefix[int(token)]
        if isinstance(node.get("items"), dict):
            return node["items"]
    return None


def _resolve(root: Any, ref: str) -> Any:
    """A local ``$ref`` (``#`` or ``#/a/b``) in ``root``; None for any other."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict) else None
