"""A script's rarely called Lua functions made on first use in a call, not at every call.

``EVALSHA`` runs the script's whole chunk at every call, so each ``local
function`` of it is made again each time: a closure and its upvalues. Most
of the write scripts' functions serve an index, an expiry or a counted
stream, and a plain write calls none of them (what they cost a single PUT:
docs/history/performance.md, "Writes' redis.calls on 2026-12-02").
``made_on_first_use`` rewrites a script's definitions so that the named
functions are made together, by one loader, the first time one of them is
called in that call:

- each named ``local function NAME(...)`` (a top-level one, ending at an
  ``end`` in column 0) leaves its place for the loader's body, in the order
  they had (a body calls only those defined before it), and the loader is
  placed after every other definition, so each name a body uses is in
  scope there as it was;
- each call of a named function outside the loader, ``NAME(``, becomes
  ``make_rare().NAME(``: the first makes them all and keeps them in a
  table, the others return that table. (Not ``(make_rare() or NAME)(``: a
  statement that starts with a parenthesis is Lua 5.1's "ambiguous syntax".)

A named function must be called, never taken as a value; ``make_rare`` names
the loader, and no script may use that name otherwise.
"""

from __future__ import annotations

import re
from typing import Iterable

LOADER = "make_rare"


def made_on_first_use(definitions: str, names: Iterable[str]) -> str:
    """``definitions`` with the functions ``names`` made by one loader on first use (see the module's docstring)."""
    names = list(names)
    if re.search(rf"(?<![\w.:]){LOADER}\b", _code(definitions)):
        raise ValueError(f"the script uses the loader's name, {LOADER!r}")
    moved = []  # (where it was, its text): in the loader in their order, as each may call those before it
    for name in names:
        found = list(re.finditer(rf"^local function {name}\(.*?^end\n", definitions, re.S | re.M))
        if len(found) != 1:
            raise ValueError(f"{name}: {len(found)} top-level definitions, not one")
        moved.append((found[0].start(), found[0].group()))
    for _, text in sorted(moved, reverse=True):
        definitions = definitions.replace(text, "", 1)
    either = "|".join(names)
    if re.search(rf"(?<![\w.:])({either})\b(?!\()", _code(definitions)):
        raise ValueError("a function made on first use is taken as a value, not called")
    definitions = re.sub(rf"(?<![\w.:])({either})\(", rf"{LOADER}().\1(", definitions)
    made = ", ".join(f"{name} = {name}" for name in names)
    loader = (
        f"{LOADER} = function()\n"
        + "".join(text for _, text in sorted(moved))
        + f"local rare = {{{made}}}\n{LOADER} = function() return rare end\nreturn rare\nend\n"
    )
    return f"local {LOADER}\n" + definitions + loader


def _code(lua: str) -> str:
    """``lua`` without its ``--`` comments (a name in a comment is neither a call nor a value)."""
    return re.sub(r"--[^\n]*", "", lua)
