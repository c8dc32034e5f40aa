"""A collection's JSON Schema (Draft 2020-12): checked once, compiled once, run on every write.

``compile_schema`` refuses what is not a valid 2020-12 schema
(``InvalidSchema``, saying why) and returns a ``CompiledSchema`` whose
``violations(document)`` lists what is wrong (JSON Pointer, keyword,
message), at most ``MAX_VIOLATIONS``, or nothing. It takes plain values and
knows nothing of HTTP, so a handler, the store's merge patch or a batch of
operations can all call it.

Two validators, one verdict. ``jsonschema`` implements the whole draft (it
passes the official test suite but for ``\\p{…}`` in patterns, which
Python's ``re`` lacks) but costs more per document on PyPy than a whole PUT.
So each schema is also compiled into nested closures
(``cache.schemas.compiler``), which PyPy's JIT compiles (dozens of times
faster; ``loadtest/_bench_validators.py`` measures both: docs/performance.md,
"Collection settings: the validator and the bench's target"), for the keywords
in ``cache.schemas.compiler.KEYWORDS``; a schema with any other
keyword (``$dynamicRef``, ``unevaluatedProperties``, a remote ``$ref`` …)
is judged by ``jsonschema`` alone. ``jsonschema`` also writes the messages,
once the fast verdict is "invalid": errors are the slow path. Both use the
formats of ``cache.schemas.formats``. ``tests/cache/test_schema.py`` runs the official
JSON-Schema-Test-Suite cases through both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Union

from cache.errors import StoreError
from cache.schemas.bounds import SchemaRefused, check_cost, check_shape, json_depth
from cache.schemas.budget import (
    MAX_DOCUMENT_DEPTH,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_VALUES_EXPLAINED,
    Exhausted,
    Meter,
    TooDeep,
    more_values_than,
)
from cache.schemas.compiler import Check, compilable, compile_closures, uses
from cache.schemas.formats import CHECKED
from cache.schemas.reference import STACK_FRAMES, make_validator, stack_depth
from cache.schemas.regex import Regex

if TYPE_CHECKING:
    import jsonschema

# ``jsonschema`` (with ``referencing``) is imported when a schema is first
# compiled, not with this module: a worker whose collections have no schema
# never needs it, and it is megabytes of a PyPy worker's resident memory
# (docs/performance.md, "Collection settings: the validator and the bench's
# target"), against issue 7's 150 MB.

DRAFT = "https://json-schema.org/draft/2020-12/schema"
MAX_VIOLATIONS = 20


@dataclass(frozen=True)
class Violation:
    """One way a document breaks its schema."""

    pointer: str  # RFC 6901, into the document ("" is the whole document)
    keyword: str
    message: str

    def as_json(self) -> Dict[str, str]:
        return {"pointer": self.pointer, "keyword": self.keyword, "message": self.message}


class DocumentInvalid(StoreError):
    """A document its collection's schema refuses; ``violations`` say where and why."""

    def __init__(self, violations: List[Violation]) -> None:
        super().__init__(f"the document breaks its collection's schema in {len(violations)} place(s)")
        self.violations = violations


class ValidationRefused(DocumentInvalid):
    """A document its schema could not judge within the bounds of ``cache.schemas.budget``: refused, never stored."""

    def __init__(self, keyword: str, message: str) -> None:
        super().__init__([Violation("", keyword, message)])


_OVER_BUDGET = (
    "validation-budget",
    f"the collection's schema took more than its validation budget ({MAX_STEPS:,} steps or "
    f"{MAX_SECONDS * 1000:.0f} ms) on this document; it is refused",
)
_TOO_DEEP = (
    "maxDepth",
    f"the document nests deeper than {MAX_DOCUMENT_DEPTH} levels where the collection's schema "
    "would follow it; it is refused",
)
_TOO_RECURSIVE = (
    "maxDepth",
    "the collection's schema recursed into this document deeper than the validator follows "
    f"({STACK_FRAMES} frames); it is refused",
)


class InvalidSchema(ValueError):
    """Not a Draft 2020-12 schema Jetway can use; the message says why."""


def format_checker() -> jsonschema.FormatChecker:
    """``jsonschema``'s checker with Jetway's formats, and only those."""
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())
    for name, check in CHECKED.items():
        checker.checks(name)(_strings_only(check))
    return checker


def _strings_only(check: Callable[[str], bool]) -> Check:
    return lambda value: not isinstance(value, str) or check(value)


class CompiledSchema:
    """A schema ready to judge documents: a fast verdict, then messages when it fails.

    Both run under ``meter`` (``cache.schemas.budget``): a document the schema
    cannot judge within its budget, or nested too deep, is ``ValidationRefused``.
    """

    def __init__(self, schema: Any, patterns: Dict[str, Regex]) -> None:
        self.schema = schema
        self.meter = Meter()
        self._reference = make_validator(schema, patterns, self.meter, format_checker())
        fast = compile_closures(schema, patterns, self.meter) if compilable(schema) else None
        self.compiled = fast is not None
        self._fast = fast
        # Where a document's depth decides how deep the validator recurses (a $ref), or an
        # equality compares whole values, the document's depth is measured first.
        self._walks = not self.compiled or uses(schema, ("$ref", "enum", "const", "uniqueItems"))

    def is_valid(self, document: Any) -> bool:
        """The verdict; ``ValidationRefused`` when the budget or the depth bound stops it."""
        if self._walks and json_depth(document, MAX_DOCUMENT_DEPTH) > MAX_DOCUMENT_DEPTH:
            raise ValidationRefused(*_TOO_DEEP)
        self.meter.start()
        try:
            if self._fast is not None:
                return self._fast(document)
            self.meter.stack_limit = stack_depth() + STACK_FRAMES
            return bool(self._reference.is_valid(document))
        except Exhausted:
            raise ValidationRefused(*_OVER_BUDGET) from None
        except (TooDeep, RecursionError):
            raise ValidationRefused(*_TOO_RECURSIVE) from None

    def violations(self, document: Any) -> List[Violation]:
        """What is wrong with ``document`` (at most ``MAX_VIOLATIONS``); empty when it is valid."""
        if self.is_valid(document):
            return []
        if more_values_than(document, MAX_VALUES_EXPLAINED):
            # jsonschema's messages show the values they judge: too costly for a large document.
            return [
                Violation(
                    "",
                    "",
                    f"the document does not match the collection's schema (details are given "
                    f"for documents of at most {MAX_VALUES_EXPLAINED} values)",
                )
            ]
        found: List[Violation] = []
        self.meter.start()
        self.meter.stack_limit = stack_depth() + STACK_FRAMES
        try:
            for error in self._reference.iter_errors(document):
                found.append(Violation(_pointer(error.absolute_path), str(error.validator), error.message[:300]))
                if len(found) == MAX_VIOLATIONS:
                    break
        except (Exhausted, TooDeep, RecursionError):
            # The verdict stands; only the list of reasons is cut short.
            found.append(Violation("", "validation-budget", "more violations were not looked for: budget spent"))
        # The two validators agree on the suite; should they ever not, refusing is the safe side.
        return found or [Violation("", "", "the document does not match the collection's schema")]


# A schema compiled, or why it was refused: what ``cache.schemas.versions`` keeps per settings version.
Compiled = Union[CompiledSchema, InvalidSchema]


def compile_schema(schema: Any) -> CompiledSchema:
    """Check ``schema`` (Draft 2020-12, within ``cache.schemas.bounds``) and compile it, or say why not."""
    if not isinstance(schema, (dict, bool)):
        raise InvalidSchema("a schema is a JSON object (or true/false)")
    if isinstance(schema, dict) and schema.get("$schema", DRAFT) != DRAFT:
        raise InvalidSchema(f"$schema must be {DRAFT} (Draft 2020-12), not {schema['$schema']!r}")
    import jsonschema
    from jsonschema.exceptions import SchemaError

    try:
        check_shape(schema)
        # No format checker: the meta-schema's "format": "regex" would run Python's re.
        jsonschema.Draft202012Validator.check_schema(schema, format_checker=None)
        patterns = check_cost(schema)
    except SchemaRefused as error:
        raise InvalidSchema(str(error)) from None
    except SchemaError as error:
        where = _pointer(error.absolute_path)
        raise InvalidSchema(f"not a Draft 2020-12 schema: at {where or '/'}: {error.message[:300]}") from None
    return CompiledSchema(schema, patterns)


def _pointer(path: Any) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)
