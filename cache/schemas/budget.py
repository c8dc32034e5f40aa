"""The work one document's validation may cost, whatever its schema.

A schema bounded at settings time (``cache.schemas.bounds``) can still ask
for much work of one document: a recursive schema whose ``allOf`` pairs
double per level of the document, ``uniqueItems`` on 100,000 items, a
pattern over a 1 MiB string. So each validation runs under a ``Meter``:
the compiled closures and ``jsonschema``'s keyword functions charge it a
unit a subschema applied (a character for a pattern), and every
``CHECK_EVERY`` units it compares the units spent with ``MAX_STEPS`` and the
clock with ``MAX_SECONDS``; past either it raises ``Exhausted``, which
``cache.schemas.schema`` answers with a 422 naming the budget (``docs/schemas.md``
says how the figures were chosen). A document nested deeper than
``MAX_DOCUMENT_DEPTH`` where the schema would recurse into it raises
``TooDeep``. The meter is the compiled schema's own and is reset by each
validation: a worker validates one document at a time.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List

MAX_STEPS = 250_000
MAX_SECONDS = 0.04
CHECK_EVERY = 4096
MAX_DOCUMENT_DEPTH = 128
# jsonschema's messages show the values they judge (repr): past this many values, one plain message.
MAX_VALUES_EXPLAINED = 5000


class Exhausted(Exception):
    """The validation of one document spent its budget."""


class TooDeep(Exception):
    """A document nested deeper than the validator follows."""


class Meter:
    """Units left before the next look at the totals and the clock."""

    __slots__ = ("clock", "deadline", "left", "seconds", "spent", "stack_limit", "steps")

    def __init__(
        self, steps: int = MAX_STEPS, seconds: float = MAX_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.steps = steps
        self.seconds = seconds
        self.clock = clock
        self.stack_limit = 0  # set by the jsonschema path (cache.schemas.reference)
        self.start()

    def start(self) -> None:
        self.left = CHECK_EVERY
        self.spent = 0
        self.deadline = self.clock() + self.seconds

    def charge(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            self.look()

    def look(self) -> None:
        """Add up what was spent since the last look; ``Exhausted`` past a bound."""
        self.spent += CHECK_EVERY - self.left
        self.left = CHECK_EVERY
        if self.spent > self.steps or self.clock() > self.deadline:
            raise Exhausted()


def unique(value: List[Any], charge: Callable[[int], None]) -> bool:
    """``uniqueItems`` as JSON equality means it, in one pass: each item's canonical form is hashed."""
    seen = set()
    for item in value:
        key = canonical(item, charge)
        if key in seen:
            return False
        seen.add(key)
    return True


def canonical(value: Any, charge: Callable[[int], None]) -> Any:
    """A hashable form equal for JSON-equal values (``1 == 1.0``; ``true`` is not ``1``; member order aside).

    Each value costs a unit, so one huge item cannot outrun the meter.
    """
    charge(1)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", int(value) if isinstance(value, float) and value.is_integer() else value)
    if isinstance(value, list):
        return ("a", tuple(canonical(item, charge) for item in value))
    if isinstance(value, dict):
        return ("o", tuple((name, canonical(value[name], charge)) for name in sorted(value)))
    return ("s" if isinstance(value, str) else "z", value)


def more_values_than(value: Any, limit: int) -> bool:
    """Whether ``value`` holds more than ``limit`` JSON values (itself included), counted without recursion."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
