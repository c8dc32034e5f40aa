"""JSON Schema validators compared: speed on one schema and document, and Draft 2020-12 compliance.

Run it with each interpreter, in an environment that has the candidates
(they are not Jetway's dependencies; ``jsonschema`` is)::

    python -m venv /tmp/vb && /tmp/vb/bin/pip install jsonschema==4.25.1 \
        fastjsonschema==2.21.2 jschon==0.11.1 [jsonschema-rs]   # pypy3 -m venv too
    PYTHONPATH=. /tmp/vb/bin/python -m loadtest._bench_validators
    PYTHONPATH=. .venv/bin/python -m loadtest._bench_validators "jetway (cache.schemas.schema)"   # Jetway's alone
    PYTHONPATH=. .venv/bin/python -m loadtest._bench_validators --patterns   # cache.schemas.regex against re

Speed: the bench's 10-property schema (types, required, formats, patterns)
against its ~1 KB document, after a warm-up long enough for PyPy's JIT,
microseconds per validation (median of batches). Compliance: the official
JSON-Schema-Test-Suite cases vendored in ``tests/data/json_schema_test_suite``
(the keywords Jetway supports, and the formats it checks), every case,
with Jetway's format functions (``cache.schemas.formats``) given to each validator.
A candidate with a failing case is out, whatever its speed.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from cache.schemas.formats import CHECKED

SUITE = Path(__file__).resolve().parent.parent / "tests" / "data" / "json_schema_test_suite"
# Groups of the suite Jetway does not claim (cache/schemas/formats.py says why).
SKIPPED_GROUPS = ("validation of A-label (punycode) host names",)

SCHEMA: Dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["id", "email", "name", "age", "created"],
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z0-9-]{3,40}$"},
        "email": {"type": "string", "format": "email"},
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "created": {"type": "string", "format": "date-time"},
        "website": {"type": "string", "format": "uri"},
        "phone": {"type": "string", "pattern": "^\\+[0-9 ]{6,20}$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 32}, "maxItems": 20},
        "active": {"type": "boolean"},
        "bio": {"type": "string", "maxLength": 2000},
    },
}


def document() -> Dict[str, Any]:
    """The ~1 KB document of the bench (``loadtest/bench``): valid against ``SCHEMA``."""
    return {
        "id": "user-0001",
        "email": "ada.lovelace@example.com",
        "name": "Ada Lovelace",
        "age": 36,
        "created": "2024-05-01T12:30:00Z",
        "website": "https://example.com/people/ada",
        "phone": "+44 20 7946 0000",
        "tags": ["math", "engines", "poetry", "notes"],
        "active": True,
        "bio": "Mathematician and writer, known for her notes on the Analytical Engine. " * 11,
    }


Validate = Callable[[Any], bool]


def jsonschema_factory(schema: Any) -> Validate:
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())
    for name, check in CHECKED.items():
        checker.checks(name)(lambda value, check=check: not isinstance(value, str) or check(value))
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    return validator.is_valid


def fastjsonschema_factory(schema: Any) -> Validate:
    import fastjsonschema

    formats = {name: (lambda value, check=check: check(value)) for name, check in CHECKED.items()}
    compiled = fastjsonschema.compile(schema, formats=formats)

    def validate(instance: Any) -> bool:
        try:
            compiled(instance)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return validate


def jschon_factory(schema: Any) -> Validate:
    import jschon

    jschon.create_catalog("2020-12")
    compiled = jschon.JSONSchema(schema, metaschema_uri=jschon.URI("https://json-schema.org/draft/2020-12/schema"))
    return lambda instance: compiled.evaluate(jschon.JSON(instance)).valid


def jsonschema_rs_factory(schema: Any) -> Validate:
    import jsonschema_rs

    formats = {name: check for name, check in CHECKED.items()}
    validator = jsonschema_rs.Draft202012Validator(schema, formats=formats, validate_formats=True)
    return validator.is_valid


def jetway_factory(schema: Any) -> Validate:
    from cache.schemas.schema import compile_schema

    return compile_schema(schema).is_valid


CANDIDATES: Dict[str, Callable[[Any], Validate]] = {
    "jsonschema": jsonschema_factory,
    "fastjsonschema": fastjsonschema_factory,
    "jschon": jschon_factory,
    "jsonschema-rs": jsonschema_rs_factory,
    "jetway (cache.schemas.schema)": jetway_factory,
}


def speed(factory: Callable[[Any], Validate], seconds: float = 8.0) -> float:
    """Microseconds per validation of the document, median of 1,000-call batches after a warm-up."""
    validate = factory(SCHEMA)
    instance = document()
    assert validate(instance), "the bench document must be valid"
    batches: List[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        for _ in range(1000):
            validate(instance)
        batches.append((time.perf_counter() - started) * 1000)
    return statistics.median(batches[len(batches) // 2 :])


def compliance(factory: Callable[[Any], Validate]) -> Tuple[int, int, List[str]]:
    """(cases passed, cases run, the first failures) over the vendored suite."""
    passed = run = 0
    failures: List[str] = []
    for path in sorted(SUITE.rglob("*.json")):
        for group in json.loads(path.read_text()):
            if group["description"] in SKIPPED_GROUPS:
                continue
            try:
                validate: Optional[Validate] = factory(group["schema"])
            except Exception as error:  # a candidate that cannot compile a valid schema fails its cases
                validate, reason = None, f"compile: {type(error).__name__}"
            for test in group["tests"]:
                run += 1
                try:
                    ok = validate is not None and validate(test["data"]) == test["valid"]
                    reason = "wrong verdict" if validate is not None else reason
                except Exception as error:
                    ok, reason = False, f"{type(error).__name__}"
                if ok:
                    passed += 1
                elif len(failures) < 400:
                    failures.append(f"{path.stem}: {group['description']} / {test['description']} ({reason})")
    return passed, run, failures


def pattern_costs(seconds: float = 3.0) -> None:
    """Per search, after a warm-up: ``cache.schemas.regex`` against ``re`` on the bench schema's patterns and values."""
    import re

    from cache.schemas.regex import compile_pattern

    cases = [("^[a-z0-9-]{3,40}$", "user-0001"), ("^\\+[0-9 ]{6,20}$", "+44 20 7946 0000"), ("b$", "a" * 2000 + "b")]
    print("| pattern | text chars | re µs | cache.schemas.regex µs |")
    print("|---|---:|---:|---:|")
    for pattern, text in cases:
        costs = []
        for search in (re.compile(pattern).search, compile_pattern(pattern).search):
            batches: List[float] = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                for _ in range(1000):
                    search(text)
                batches.append((time.perf_counter() - started) * 1000)
            costs.append(statistics.median(batches[len(batches) // 2 :]))
        print(f"| `{pattern}` | {len(text)} | {costs[0]:.2f} | {costs[1]:.2f} |", flush=True)


def main(argv: List[str]) -> int:
    if argv == ["--patterns"]:
        pattern_costs()
        return 0
    names = argv or list(CANDIDATES)
    print(f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})")
    print("| validator | µs per 1 KB document | suite cases passed |")
    print("|---|---:|---:|")
    details: Dict[str, List[str]] = {}
    for name in names:
        factory = CANDIDATES[name]
        try:
            micro = f"{speed(factory):.1f}"
        except ImportError:
            print(f"| {name} | not installed here | - |")
            continue
        passed, run, failures = compliance(factory)
        details[name] = failures
        print(f"| {name} | {micro} | {passed} / {run} |", flush=True)
    for name, failures in details.items():
        if failures:
            print(f"\n{name}: {len(failures)} failures (first 400 listed)")
            for failure in failures[:60]:
                print("  " + failure)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
