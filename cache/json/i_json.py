"""I-JSON (RFC 7493) on input: no duplicate member names, no lone surrogates.

Parsers disagree on which of two equal names wins, so a document with
both could pass a validator that saw one value and reach a consumer that
sees the other; a lone ``\\uD800`` escape is no Unicode text at all. Both
are refused where a body is parsed (``cache.json.codec.loads``).

Checked after the fast parse, not with parse hooks: PyPy's JIT-compiled
parser is taken only without hooks, and ``object_pairs_hook`` made a
document's parse many times slower there
(``loadtest/studies/_bench_codec.py`` measures what the checks below add). Instead:

- a name is repeated exactly when the text has more members than the
  parsed objects hold; every colon outside a string separates one member,
  so counting colons (all of them, then only when that differs, less those
  in the parsed strings) against the members parsed decides it;
- a lone surrogate can only come from a ``\\uD8..``-``\\uDF..`` escape
  (UTF-8 cannot encode one), and the parser joins a valid pair into one
  character, so only when such an escape is present are the parsed strings
  searched for a surrogate left alone.

The slow ways (a pairs hook, a walk of every string) run only to name
what is wrong, or when a cheap sign says they must.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Iterator, List, Set, Tuple

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_ESCAPED_COLON = re.compile(r"\\u003[aA]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class NotIJson(ValueError):
    """Valid JSON that I-JSON refuses; the message says what and where."""


def require(text: str, value: Any, members: int) -> None:
    """Raise ``NotIJson`` if ``text`` repeats a name or holds a lone surrogate.

    ``value`` is what ``text`` parsed to, and ``members`` how many object
    members it holds in all.
    """
    colons = text.count(":")
    if colons != members and _colons_outside_strings(text, value, colons) != members:
        raise NotIJson(f"duplicate member name {_first_duplicate(text)[:64]!r}")
    if _SURROGATE_ESCAPE.search(text):
        for string in _strings(value):
            match = _SURROGATE.search(string)
            if match:
                raise NotIJson(f"lone surrogate \\u{ord(match.group()):04x} in a string")


def _colons_outside_strings(text: str, value: Any, colons: int) -> int:
    if _ESCAPED_COLON.search(text):
        # A colon written as an escape is in the parsed strings but not
        # among the text's colons: only a scan of the text can tell.
        return colons - sum(string.count(":") for string in _STRING.findall(text))
    # Otherwise each colon of a parsed string is one of the text's (a
    # walk of the parsed strings is much cheaper than scanning the text).
    return colons - _colons_in_strings(value)


def _colons_in_strings(value: Any) -> int:
    """The colons in every string of a parsed value, member names included.

    A loop over ``_strings``, not ``sum`` of a generator expression over it:
    every document with a time or a URL in it comes here, and on PyPy the
    two generators cost more than this loop (timed in a warm loop, each in
    a process of its own).
    """
    total = 0
    for string in _strings(value):
        total += string.count(":")
    return total


def _first_duplicate(text: str) -> str:
    found: List[str] = []

    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        seen: Set[str] = set()
        for name, _ in items:
            if name in seen and not found:
                found.append(name)
            seen.add(name)
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)
    return found[0] if found else "?"


def _strings(value: Any) -> Iterator[str]:
    """Every string in a parsed value, member names included."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item.keys()
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
