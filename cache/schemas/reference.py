"""``jsonschema``'s Draft 2020-12 validator, made safe to run on a collection's schema.

``cache.schemas.schema`` uses ``jsonschema`` for the messages once a document is
refused, and as the whole verdict for keywords its closures do not compile.
As shipped, it would fetch a remote ``$ref`` with ``urlopen``, match
``pattern`` with Python's backtracking ``re`` and compare ``uniqueItems``
pairwise. The validator made here differs in exactly that:

- its ``referencing.Registry`` holds the schema and the meta-schemas
  ``jsonschema`` ships, and its ``retrieve`` refuses: nothing is fetched;
- ``pattern``, ``patternProperties`` and ``additionalProperties`` (which
  matches ``patternProperties``' keys) use ``cache.schemas.regex``;
- ``uniqueItems`` hashes canonical forms (``cache.schemas.budget.unique``);
- every keyword function charges the validation's ``Meter`` a unit, and a
  ``$ref`` or ``$dynamicRef`` first checks how deep the stack is, so a
  recursion ends with ``TooDeep`` long before Python's limit (under PyPy a
  ``RecursionError`` inside ``rpds``' cpyext killed the worker).

- ``unevaluatedProperties``, whose helper in ``jsonschema._utils`` matches
  ``patternProperties``' keys with ``re``, is ``cache.schemas.unevaluated``'s
  copy of it matching with ``cache.schemas.regex``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterator

from cache.schemas.budget import Meter, TooDeep, unique
from cache.schemas.regex import Regex, compile_pattern
from cache.schemas.unevaluated import unevaluated_properties

# Frames a validation may add below where it started before a $ref stops it:
# PyPy's limit is 1000 and a reactor's stack is ~150 deep when a write is validated.
STACK_FRAMES = 450


def make_validator(schema: Any, patterns: Dict[str, Regex], meter: Meter, format_checker: Any) -> Any:
    """A validator of ``schema`` that charges ``meter`` and never fetches."""
    import jsonschema
    from jsonschema_specifications import REGISTRY as SPECIFICATIONS
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    from cache.schemas.bounds import _never_retrieve

    resource = DRAFT202012.create_resource(schema)
    local = Registry(retrieve=_never_retrieve).with_resource(resource.id() or "", resource)  # type: ignore[call-arg]
    registry = SPECIFICATIONS.combine(local)
    base = jsonschema.Draft202012Validator
    keywords = {name: _charged(function, meter) for name, function in base.VALIDATORS.items()}
    keywords.update(_own_keywords(patterns, meter))
    for name in ("$ref", "$dynamicRef"):
        keywords[name] = _stack_checked(keywords[name], meter)
    cls = jsonschema.validators.extend(base, validators=keywords)
    return cls(schema, registry=registry, format_checker=format_checker)


def stack_depth() -> int:
    """How many frames are on the stack now (walked once a validation, on the slow path only)."""
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


class _Patterns(dict):  # type: ignore[type-arg]
    """The schema's patterns, compiled at settings time; one met elsewhere (a meta-schema's) compiled here."""

    def __missing__(self, text: str) -> Regex:
        self[text] = compile_pattern(text)
        return self[text]


def _charged(function: Callable[..., Any], meter: Meter) -> Callable[..., Any]:
    def charged(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        meter.charge(1)
        return function(validator, value, instance, schema)

    return charged


def _stack_checked(function: Callable[..., Any], meter: Meter) -> Callable[..., Any]:
    def checked(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        try:
            sys._getframe(meter.stack_limit)  # type: ignore[attr-defined]
        except ValueError:
            return function(validator, value, instance, schema)
        raise TooDeep()

    return checked


def _own_keywords(known: Dict[str, Regex], meter: Meter) -> Dict[str, Callable[..., Any]]:
    from jsonschema import ValidationError
    from jsonschema._keywords import additionalProperties

    patterns = _Patterns(known)

    def pattern(validator: Any, text: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not patterns[text].search(instance, meter.charge):
            yield ValidationError(f"{instance!r} does not match {text!r}")

    def pattern_properties(validator: Any, members: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for text, subschema in members.items():
            for name, value in instance.items():
                if patterns[text].search(name, meter.charge):
                    yield from validator.descend(value, subschema, path=name, schema_path=text)

    def additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        keys = [text for text in schema.get("patternProperties", {})]
        declared = schema.get("properties", {})
        matched = {name for name in instance if any(patterns[text].search(name, meter.charge) for text in keys)}
        # jsonschema's own, on the members neither properties nor a pattern names.
        view = {name: value for name, value in instance.items() if name in declared or name not in matched}
        narrowed = {key: value for key, value in schema.items() if key != "patternProperties"}
        yield from additionalProperties(validator, extra, view, narrowed)

    def unique_items(validator: Any, wanted: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if wanted and validator.is_type(instance, "array") and not unique(instance, meter.charge):
            yield ValidationError("the array has non-unique elements")

    return {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
        "unevaluatedProperties": unevaluated_properties(lambda text, name: patterns[text].search(name, meter.charge)),
        "uniqueItems": unique_items,
    }
