"""The one place that picks the JSON codec for this interpreter.

On PyPy the stdlib ``json`` is JIT-compiled and many times faster than
``ujson``, which goes through the C-API emulation; on CPython ``ujson`` dumps
several times faster. Parsing always uses the stdlib: ``ujson.loads`` accepts
``NaN`` and ``Infinity`` and turns ``1e400`` into ``inf``, which RFC 8259
validation must not do.

One strict reader: RFC 8259's grammar plus I-JSON (``cache.json.i_json``), and
anything else is a ``JsonError`` (a 400 where a body is read), never another
exception. PyPy's ``json.loads`` has a parser written in RPython, but takes
it only when called without hooks; with the hooks that reject ``NaN`` and
``1e400`` it falls back to the pure-Python decoder, several times slower
(docs/history/performance.md, "The changes, in the order done") and laxer
than the grammar (``cache.json.grammar`` says how). So on PyPy a body is parsed
without hooks first and kept when every number in it is finite; the RPython
parser accepts nothing the grammar refuses (``tests/cache/test_json_grammar.py``
holds it to that). Anything it refused or found not finite must first pass
``cache.json.grammar`` before the hooked parse reads it. CPython's hooked
parser is C and exactly the grammar, so it reads every body directly.

A number's range: a float that no double holds (``1e400``) is refused, as
is an integer longer than the interpreter converts (4,300 digits, on
CPython 3.11 and PyPy 3.9 alike): refused with a 400, never a 500.
"""

from __future__ import annotations

import json
import math
import platform
import sys
from typing import Any, Callable, NoReturn, Optional, Tuple

from cache.json import grammar as json_grammar
from cache.json import i_json


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

    # One encoder, not one per call as json.dumps with options makes, and no
    # check for cycles: a value parsed from JSON has none, and a value too
    # deep still raises RecursionError. The markers of that check were a
    # visible share of a batch of puts (vmprof, loadtest/studies/_batch_pace.py --profile).
    encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)
    return encoder.encode


_dumps = _make_dumps()
CODEC_NAME = "ujson" if getattr(_dumps, "__name__", "") == "ujson_dumps" else "json"


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # Valid RFC 8259 syntax, but no double holds it: storing it would
        # make the document impossible to re-serialize (for a merge patch).
        raise JsonError(f"the number {text if len(text) <= 40 else text[:40] + '...'} is out of range")
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
    """``loads`` without the I-JSON checks (``loadtest/studies/_bench_codec.py`` measures what they add)."""
    return _parse(data.decode("utf-8"))


def _parse(text: str) -> Tuple[Any, int]:
    """The value, and how many object members it holds in all."""
    if _TRY_HOOKLESS_PARSE:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            pass  # refused, or a number too long: judged below
        else:
            members = _members_if_finite(value)
            if members is not None:
                return value, members
        # The hooked parse below is the pure-Python decoder: laxer than the grammar.
        _require_grammar(text)
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
    except JsonError:
        raise  # from a hook: a constant or a float out of range
    except json.JSONDecodeError as error:
        # Only on CPython (on PyPy the grammar passed the text first): its C
        # parser's words. Not the grammar's: pure Python there, far slower on a large body.
        raise JsonError(f"malformed JSON: {error}") from None
    except ValueError:
        # The only other refusal of a text the grammar passed: int() of
        # more digits than the interpreter converts (quadratic time past it).
        raise JsonError(f"an integer has more than {_max_int_digits()} digits") from None
    except RecursionError:
        # RFC 8259 lets a parser limit nesting; the stack is the limit here,
        # and running into it is the client's error, not a 500.
        raise JsonError("the JSON is nested too deeply") from None


def _require_grammar(text: str) -> None:
    try:
        json_grammar.check(text)
    except json_grammar.TooDeep:
        raise JsonError("the JSON is nested too deeply") from None
    except json_grammar.GrammarError as error:
        raise JsonError(f"malformed JSON: {error}") from None


def _max_int_digits() -> int:
    limit: Callable[[], int] = getattr(sys, "get_int_max_str_digits", lambda: 4300)
    return limit()


def dumps(value: Any) -> bytes:
    """Serialize ``value`` compactly to UTF-8 bytes, or raise ``JsonError``."""
    try:
        return _dumps(value).encode("utf-8")
    except (ValueError, OverflowError, UnicodeEncodeError, RecursionError) as error:
        raise JsonError(f"cannot serialize as JSON: {error}") from None
