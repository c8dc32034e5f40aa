"""``unevaluatedProperties`` as ``jsonschema`` judges it, with patterns matched by ``cache.schemas.regex``.

``jsonschema`` (4.x) judges ``unevaluatedProperties`` with the helper
``jsonschema._utils.find_evaluated_property_keys_by_schema``, which matches
``patternProperties``' keys with Python's backtracking ``re.search``:
``{"patternProperties": {"^(a+)+$": {}}, "unevaluatedProperties": false}``
would cost seconds per member name. This is that keyword and that helper,
the same walk, with ``search(pattern, name)`` given by the validator
(``cache.schemas.regex``, charging the validation's meter). Everything else it
does goes through the validator's own keywords (``descend``, ``is_valid``),
which are metered; its recursion follows ``$ref`` and the in-place
applicators on one value, which ``cache.schemas.bounds`` keeps acyclic and
at most ``MAX_CHAIN`` deep. Checked against ``jsonschema``'s own on the
same schemas in ``tests/cache/test_schema_unevaluated.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

Search = Callable[[str, str], bool]
_IN_PLACE = ("allOf", "oneOf", "anyOf")


def unevaluated_properties(search: Search) -> Callable[..., Iterator[Any]]:
    """The ``unevaluatedProperties`` keyword function, matching patterns with ``search``."""
    from jsonschema import ValidationError
    from jsonschema._utils import extras_msg

    def keyword(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        evaluated = set(evaluated_keys(validator, instance, schema, search))
        failed = [
            name
            for name in instance
            if name not in evaluated and not _valid(validator.descend(instance[name], unevaluated, path=name))
        ]
        if not failed:
            return
        if unevaluated is False:
            message = "Unevaluated properties are not allowed (%s %s unexpected)"
            yield ValidationError(message % extras_msg(sorted(failed, key=str)))
        else:
            message = "Unevaluated properties are not valid under the given schema (%s %s unevaluated and invalid)"
            yield ValidationError(message % extras_msg(failed))

    return keyword


def evaluated_keys(validator: Any, instance: Any, schema: Any, search: Search) -> List[str]:
    """The members of ``instance`` that ``schema`` evaluates (``find_evaluated_property_keys_by_schema``)."""
    if validator.is_type(schema, "boolean"):
        return []
    found: List[str] = []
    for keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(keyword)
        if ref is not None:
            resolved = validator._resolver.lookup(ref)
            inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            found += evaluated_keys(inner, instance, resolved.contents, search)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        found += properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        subschema = schema.get(keyword)
        if subschema is not None:
            found += (name for name, value in instance.items() if _valid(validator.descend(value, subschema)))
    for pattern in schema.get("patternProperties", ()):
        found += (name for name in instance if search(pattern, name))
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            found += evaluated_keys(validator, instance, subschema, search)
    for keyword in _IN_PLACE:
        for subschema in schema.get(keyword, ()):
            if _valid(validator.descend(instance, subschema)):
                found += evaluated_keys(validator, instance, subschema, search)
    found += _conditional(validator, instance, schema, search)
    return found


def _conditional(validator: Any, instance: Any, schema: Any, search: Search) -> List[str]:
    if "if" not in schema:
        return []
    if validator.evolve(schema=schema["if"]).is_valid(instance):
        found = evaluated_keys(validator, instance, schema["if"], search)
        if "then" in schema:
            found += evaluated_keys(validator, instance, schema["then"], search)
        return found
    if "else" in schema:
        return evaluated_keys(validator, instance, schema["else"], search)
    return []


def _valid(errors: Iterator[Any]) -> bool:
    return next(errors, None) is None
