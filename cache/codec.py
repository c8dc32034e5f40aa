"""The one place that picks the JSON codec for this interpreter.

On PyPy the stdlib ``json`` is JIT-compiled and many times faster than
``ujson``, which goes through the C-API emulation; on CPython ``ujson`` dumps
about 4x faster. Parsing always uses the stdlib: ``ujson.loads`` accepts
``NaN`` and ``Infinity`` and turns ``1e400`` into ``inf``, which RFC 8259
validation must not do.

PyPy's ``json.loads`` has a parser written in RPython, but takes it only
when called without hooks; with the hooks that reject ``NaN`` and ``1e400``
it falls back to the pure-Python decoder, ~5x slower (3.7-4.3 against
0.7-0.8 us for a 200 B document, warm loop). So on PyPy a body is parsed
without hooks first, and kept when no number in it is infinite or NaN; the
two parsers refuse the same texts otherwise (only their messages differ),
so anything refused or not finite is parsed again by the strict parser,
whose error is the one reported.
"""

from __future__ import annotations

import json
import math
import platform
from typing import Any, Callable, NoReturn, Optional, Tuple

from cache import i_json


class JsonError(ValueError):
    """The bytes are not an RFC 8259 JSON text (or cannot be serialized)."""


def _reject_constant(name: str) -> NoReturn:
    raise JsonError(f"{name} is not a JSON value")


def _make_dumps() -> Callable[[Any], str]:
    if platform.python_implementation() == "CPython":
        try:
            import ujson
        except ImportError:  # pragma: no cover - requirements install it
            pass
        else:

            def ujson_dumps(value: Any) -> str:
                return ujson.dumps(value, ensure_ascii=False, escape_forward_slashes=False)

            return ujson_dumps

    def stdlib_dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    return stdlib_dumps


_dumps = _make_dumps()
CODEC_NAME = "ujson" if _dumps.__name__ == "ujson_dumps" else "json"


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # Valid RFC 8259 syntax, but no double holds it: storing it would
        # make the document impossible to re-serialize (for a merge patch).
        raise JsonError(f"the number {text} is out of range")
    return value


_TRY_HOOKLESS_PARSE = platform.python_implementation() == "PyPy"


def loads(data: bytes) -> Any:
    """Parse UTF-8 I-JSON bytes strictly, or raise ``JsonError``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise JsonError(f"body is not valid UTF-8: {error.reason}") from None
    value, members = _parse(text)
    try:
        i_json.require(text, value, members)
    except i_json.NotIJson as error:
        raise JsonError(str(error)) from None
    return value


def _parse_bytes(data: bytes) -> Tuple[Any, int]:
    """``loads`` without the I-JSON checks (``loadtest/bench_codec.py`` measures what they add)."""
    return _parse(data.decode("utf-8"))


def _parse(text: str) -> Tuple[Any, int]:
    """The value, and how many object members it holds in all."""
    if _TRY_HOOKLESS_PARSE:
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            pass  # the strict parse below says what is wrong
        else:
            members = _members_if_finite(value)
            if members is not None:
                return value, members
    value = _strict_loads(text)
    return value, _members_if_finite(value) or 0


def _members_if_finite(value: Any) -> Optional[int]:
    """How many object members ``value`` holds, or None if a number in it is not finite (one walk for both)."""
    members = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return None
        elif isinstance(item, dict):
            members += len(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return members


def _strict_loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as error:
        raise JsonError(f"malformed JSON: {error}") from None
    except RecursionError:
        # RFC 8259 lets a parser limit nesting; the stack is the limit here,
        # and running into it is the client's error, not a 500.
        raise JsonError("the JSON is nested too deeply") from None


def dumps(value: Any) -> bytes:
    """Serialize ``value`` compactly to UTF-8 bytes, or raise ``JsonError``."""
    try:
        return _dumps(value).encode("utf-8")
    except (ValueError, OverflowError, UnicodeEncodeError, RecursionError) as error:
        raise JsonError(f"cannot serialize as JSON: {error}") from None
