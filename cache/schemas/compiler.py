"""Schema -> nested closures: the fast verdict of ``cache.schemas.schema``, compiled once per schema version.

PyPy's JIT compiles the closures (dozens of times faster than ``jsonschema``:
docs/performance.md, "Collection settings: the validator and the bench's target") for
the keywords in ``KEYWORDS``; ``compilable`` says whether a schema uses only
those (and only local ``$ref``s), else ``cache.schemas.schema`` leaves the verdict to
``jsonschema``. Every node that applies subschemas charges the validation's
``Meter`` (``cache.schemas.budget``); a leaf's cost is constant or charged where
it is spent (patterns, formats, ``uniqueItems``, ``enum``). Plain values in and
out: nothing here knows of HTTP, Redis or the reactor.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import unquote

from cache.schemas.bounds import subschemas
from cache.schemas.budget import Meter, unique
from cache.schemas.formats import CHECKED
from cache.schemas.regex import CHARS_A_UNIT, Regex

Check = Callable[[Any], bool]

# Keywords that only annotate: they never change a verdict.
_ANNOTATIONS = frozenset(
    (
        "$schema",
        "$comment",
        "$defs",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "$vocabulary",
    )
)
_COMPILED = frozenset(
    (
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "$ref",
    )
)
KEYWORDS = _ANNOTATIONS | _COMPILED


def compilable(schema: Any) -> bool:
    """Whether every keyword (at every depth) is one this module compiles, and every ``$ref`` is local."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or not set(schema) <= KEYWORDS:
        return False
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
        return False
    return all(compilable(sub) for sub in _subschemas(schema))


def uses(schema: Any, keywords: Any) -> bool:
    """Whether any subschema of ``schema`` (``$defs`` too) has one of ``keywords``."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if any(keyword in node for keyword in keywords):
                return True
            stack.extend(_every_subschema(node))
    return False


def _every_subschema(schema: Dict[str, Any]) -> List[Any]:
    return [sub for sub, _ in subschemas(schema)]


def _subschemas(schema: Dict[str, Any]) -> List[Any]:
    subs: List[Any] = []
    for keyword in ("additionalProperties", "propertyNames", "items", "contains", "not", "if", "then", "else"):
        if keyword in schema:
            subs.append(schema[keyword])
    for keyword in ("properties", "patternProperties", "$defs"):
        subs.extend(schema.get(keyword, {}).values())
    for keyword in ("prefixItems", "allOf", "anyOf", "oneOf"):
        subs.extend(schema.get(keyword, []))
    return subs


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_TYPES: Dict[str, Check] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "number": _is_number,
    # 2020-12: 1.0 is an integer.
    "integer": lambda value: (isinstance(value, int) and not isinstance(value, bool))
    or (isinstance(value, float) and value.is_integer()),
}


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON means it: ``1 == 1.0``, but ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if _is_number(a):
        return _is_number(b) and a == b
    return type(a) is type(b) and a == b


def _all(checks: List[Check]) -> Check:
    if not checks:
        return lambda value: True
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda value: first(value) and second(value)
    frozen = tuple(checks)
    return lambda value: all(check(value) for check in frozen)


def _metered(check: Check, meter: Meter) -> Check:
    """``check``, charging ``meter`` a unit each time it runs (one subschema applied to one value)."""

    def metered(value: Any) -> bool:
        meter.left -= 1
        if meter.left < 0:
            meter.look()
        return check(value)

    return metered


def _when(applies: Check, check: Check) -> Check:
    """``check`` for values ``applies`` to; any other value passes (keywords are type-specific)."""
    return lambda value: not applies(value) or check(value)


class _Compiler:
    """Schema -> closure, once per schema version; ``$ref``s are resolved within the root."""

    def __init__(self, root: Any, patterns: Dict[str, Regex], meter: Meter) -> None:
        self.root = root
        self.refs: Dict[str, List[Optional[Check]]] = {}
        self.patterns = patterns
        self.meter = meter

    def compile_root(self) -> Check:
        """The whole schema's check."""
        return self.compile(self.root)

    def compile(self, schema: Any) -> Check:
        if schema is True or schema == {}:
            return lambda value: True
        if schema is False:
            return lambda value: False
        checks: List[Check] = []
        for part in (self._generic, self._numeric, self._string, self._array, self._object, self._logic):
            checks.extend(part(schema))
        # A leaf's cost is constant or charged where it is spent (patterns, formats, uniqueItems, enum);
        # a node that applies subschemas is charged each time it runs.
        if "$ref" in schema or _every_subschema(schema):
            return _metered(_all(checks), self.meter)
        return _all(checks)

    def _ref(self, ref: str) -> Check:
        # A cell filled once compiled, so a recursive schema compiles once.
        if ref not in self.refs:
            cell: List[Optional[Check]] = [None]
            self.refs[ref] = cell
            cell[0] = self.compile(self._resolve(ref))
        cell = self.refs[ref]
        return lambda value: cell[0](value)  # type: ignore[misc]

    def _resolve(self, ref: str) -> Any:
        target = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            target = target[int(part)] if isinstance(target, list) else target[part]
        return target

    def _generic(self, schema: Dict[str, Any]) -> List[Check]:
        checks: List[Check] = []
        if "$ref" in schema:
            checks.append(self._ref(schema["$ref"]))
        if "type" in schema:
            names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            tests = tuple(_TYPES[name] for name in names)
            checks.append(tests[0] if len(tests) == 1 else lambda value: any(test(value) for test in tests))
        if "enum" in schema:
            options, charge = tuple(schema["enum"]), self.meter.charge
            checks.append(lambda value: charge(len(options)) or any(json_equal(value, option) for option in options))
        if "const" in schema:
            constant = schema["const"]
            checks.append(lambda value: json_equal(value, constant))
        return checks

    def _numeric(self, schema: Dict[str, Any]) -> List[Check]:
        checks: List[Check] = []
        if "minimum" in schema:
            low = schema["minimum"]
            checks.append(lambda value: value >= low)
        if "maximum" in schema:
            high = schema["maximum"]
            checks.append(lambda value: value <= high)
        if "exclusiveMinimum" in schema:
            above = schema["exclusiveMinimum"]
            checks.append(lambda value: value > above)
        if "exclusiveMaximum" in schema:
            below = schema["exclusiveMaximum"]
            checks.append(lambda value: value < below)
        if "multipleOf" in schema:
            checks.append(_multiple_of(schema["multipleOf"]))
        return [_when(_is_number, check) for check in checks]

    def _string(self, schema: Dict[str, Any]) -> List[Check]:
        checks: List[Check] = []
        charge = self.meter.charge
        if "minLength" in schema:
            shortest = schema["minLength"]
            checks.append(lambda value: len(value) >= shortest)  # code points, as the draft counts
        if "maxLength" in schema:
            longest = schema["maxLength"]
            checks.append(lambda value: len(value) <= longest)
        if "pattern" in schema:
            search, charge = (
                self.patterns[schema["pattern"]].search,
                self.meter.charge,
            )  # not anchored, as the draft says
            checks.append(lambda value: search(value, charge))
        if schema.get("format") in CHECKED:
            test = CHECKED[schema["format"]]
            checks.append(lambda value: charge(len(value) // CHARS_A_UNIT) or test(value))
        return [_when(lambda value: isinstance(value, str), check) for check in checks]

    def _array(self, schema: Dict[str, Any]) -> List[Check]:
        checks: List[Check] = []
        checks += _length_bounds(schema, "minItems", "maxItems")
        if schema.get("uniqueItems") is True:
            charge = self.meter.charge
            checks.append(lambda value: unique(value, charge))
        prefix = tuple(self.compile(sub) for sub in schema.get("prefixItems", ()))
        if prefix:
            checks.append(lambda value: all(check(item) for check, item in zip(prefix, value)))
        if "items" in schema:
            each, start = self.compile(schema["items"]), len(prefix)
            charge = self.meter.charge
            checks.append(lambda value: charge(len(value)) or all(each(item) for item in value[start:]))
        if "contains" in schema:
            checks.append(self._contains(schema))
        return [_when(lambda value: isinstance(value, list), check) for check in checks]

    def _contains(self, schema: Dict[str, Any]) -> Check:
        matches, fewest, most = (
            self.compile(schema["contains"]),
            schema.get("minContains", 1),
            schema.get("maxContains"),
        )

        charge = self.meter.charge

        def contains(value: List[Any]) -> bool:
            charge(len(value))
            count = sum(1 for item in value if matches(item))
            return count >= fewest and (most is None or count <= most)

        return contains

    def _object(self, schema: Dict[str, Any]) -> List[Check]:
        checks: List[Check] = []
        if "required" in schema:
            names = tuple(schema["required"])
            checks.append(lambda value: all(name in value for name in names))
        checks += _length_bounds(schema, "minProperties", "maxProperties")
        for name, dependents in schema.get("dependentRequired", {}).items():
            checks.append(
                lambda value, name=name, needs=tuple(dependents): name not in value or all(n in value for n in needs)
            )
        if "propertyNames" in schema:
            named = self.compile(schema["propertyNames"])
            charge = self.meter.charge
            checks.append(lambda value: charge(len(value)) or all(named(name) for name in value))
        members = self._members(schema)
        if members is not None:
            checks.append(members)
        return [_when(lambda value: isinstance(value, dict), check) for check in checks]

    def _members(self, schema: Dict[str, Any]) -> Optional[Check]:
        """``properties``, ``patternProperties`` and ``additionalProperties``: one pass over the members."""
        known = {name: self.compile(sub) for name, sub in schema.get("properties", {}).items()}
        patterns = tuple(
            (self.patterns[p].search, self.compile(sub)) for p, sub in schema.get("patternProperties", {}).items()
        )
        charge = self.meter.charge
        extra = self.compile(schema["additionalProperties"]) if "additionalProperties" in schema else None
        if not known and not patterns and extra is None:
            return None
        if not patterns and extra is None:
            # The common case: look up each declared property, ignore the rest.
            pairs = tuple(known.items())
            return lambda value: all(check(value[name]) for name, check in pairs if name in value)

        def members(value: Dict[str, Any]) -> bool:
            charge(len(value))
            for name, item in value.items():
                check = known.get(name)
                if check is not None and not check(item):
                    return False
                matched = check is not None
                for search, pattern_check in patterns:
                    if search(name, charge):
                        matched = True
                        if not pattern_check(item):
                            return False
                if not matched and extra is not None and not extra(item):
                    return False
            return True

        return members

    def _logic(self, schema: Dict[str, Any]) -> List[Check]:
        checks: List[Check] = []
        if "allOf" in schema:
            checks.append(_all([self.compile(sub) for sub in schema["allOf"]]))
        if "anyOf" in schema:
            anyof = tuple(self.compile(sub) for sub in schema["anyOf"])
            checks.append(lambda value: any(check(value) for check in anyof))
        if "oneOf" in schema:
            oneof = tuple(self.compile(sub) for sub in schema["oneOf"])
            checks.append(lambda value: sum(1 for check in oneof if check(value)) == 1)
        if "not" in schema:
            negated = self.compile(schema["not"])
            checks.append(lambda value: not negated(value))
        if "if" in schema:
            checks.append(self._conditional(schema))
        return checks

    def _conditional(self, schema: Dict[str, Any]) -> Check:
        condition = self.compile(schema["if"])
        then = self.compile(schema.get("then", True))
        otherwise = self.compile(schema.get("else", True))
        return lambda value: then(value) if condition(value) else otherwise(value)


def _length_bounds(schema: Dict[str, Any], low: str, high: str) -> List[Check]:
    """The checks of a ``min*``/``max*`` pair of keywords on ``len(value)`` (items, properties)."""
    checks: List[Check] = []
    if low in schema:
        fewest = schema[low]
        checks.append(lambda value: len(value) >= fewest)
    if high in schema:
        most = schema[high]
        checks.append(lambda value: len(value) <= most)
    return checks


def _multiple_of(divisor: Any) -> Check:
    # As jsonschema decides it: a float divisor wants a whole quotient (exactly, as
    # fractions, when the float quotient overflows); an int divisor, no remainder.
    def multiple(value: Any) -> bool:
        if not isinstance(divisor, float):
            return not value % divisor
        try:
            quotient = value / divisor
            return int(quotient) == quotient
        except OverflowError:
            return (Fraction(value) / Fraction(divisor)).denominator == 1

    return multiple


def compile_closures(schema: Any, patterns: Dict[str, Regex], meter: Meter) -> Check:
    """``schema`` (meta-valid, ``compilable``, its patterns compiled) as one check charging ``meter``."""
    return _Compiler(schema, patterns, meter).compile_root()
