"""Small JSON builders the document's modules share: references, closed objects, anchored patterns."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Pattern

Json = Dict[str, Any]


def ref(kind: str, name: str) -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def refs(kind: str, names: Iterable[str]) -> List[Json]:
    return [ref(kind, name) for name in names]


def closed(properties: Json, required: Iterable[str], description: str) -> Json:
    """An object schema with exactly these members."""
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def anchored(regex: Pattern[str]) -> str:
    """A ``re`` pattern ending in ``\\Z`` as an anchored ECMA-262 pattern."""
    if not regex.pattern.endswith(r"\Z"):
        raise ValueError(f"{regex.pattern!r} is not anchored with \\Z")
    return "^" + regex.pattern[: -len(r"\Z")] + "$"


def parameter(name: str, where: str, description: str, schema: Json, **extra: Any) -> Json:
    return {"name": name, "in": where, "description": description, "schema": schema, **extra}
