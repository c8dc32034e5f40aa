"""Cyclone's private members are touched in handlers/framework.py only, and each one it touches exists in the
installed Cyclone: an upgrade that renames one fails here, not in production."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import List

import cyclone.httpserver
import cyclone.httputil
import cyclone.web

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORK = ROOT / "handlers" / "framework.py"
# What handlers/framework.py overrides or reads of Cyclone's (its docstring says why, one by one).
CYCLONE_PRIVATES = (
    "_execute",
    "_execute_success",
    "_execute_failure",
    "_convert_header_value",
    "_generate_headers",
    "_handle_request_exception",
    "_headers",
    "_list_headers",
    "_write_buffer",
    "_status_code",
    "_reason",
    "_transforms",
    "_finished",
    "_headers_written",
    "_auto_finish",
    "_finish_request",
    "_request",
    "_request_finished",
    "_finish_callback",
    "_as_list",
    "_last_key",
)
USED = re.compile(r"\.(" + "|".join(CYCLONE_PRIVATES) + r")\b")


def lines_using(used: re.Pattern, allowed: Path) -> List[str]:
    """Every line of the app that matches ``used``, but in ``allowed``."""
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("api", "handlers", "cache")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if used.search(line)
    ]


def test_cyclone_privates_are_touched_only_in_handlers_framework() -> None:
    assert lines_using(USED, FRAMEWORK) == []


def test_each_cyclone_private_the_framework_relies_on_is_in_the_installed_cyclone() -> None:
    source = inspect.getsource(cyclone.web) + inspect.getsource(cyclone.httpserver)
    source += inspect.getsource(cyclone.httputil)
    missing = [name for name in CYCLONE_PRIVATES if not re.search(r"(\.|def )" + name + r"\b", source)]
    assert missing == []
    framework = FRAMEWORK.read_text()
    assert [name for name in CYCLONE_PRIVATES if not re.search(r"(\.|def )" + name + r"\b", framework)] == []


TWISTED_MODULE = ROOT / "cache" / "twisted_internals.py"


def test_twisted_privates_are_touched_only_in_cache_twisted_internals() -> None:
    from cache.twisted_internals import TOUCHED

    names = sorted({name for touched in TOUCHED.values() for name in touched if name != "offset"})
    used = re.compile(r"\.(" + "|".join(names) + r")\b|\.doRead\s*=")
    assert lines_using(used, TWISTED_MODULE) == []


def test_each_twisted_private_touched_is_in_the_installed_twisted() -> None:
    import importlib

    from cache.twisted_internals import TOUCHED

    missing = []
    for dotted, names in TOUCHED.items():
        module_name, _, class_name = dotted.rpartition(".")
        owner = getattr(importlib.import_module(module_name), class_name)
        source = "".join(inspect.getsource(klass) for klass in owner.__mro__ if klass.__module__.startswith("twisted"))
        missing += [f"{dotted}.{name}" for name in names if not re.search(r"(\.|def )" + name + r"\b", source)]
    assert missing == []
