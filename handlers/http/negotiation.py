"""Which stored representation of a document a request gets, by its ``Accept-Encoding``.

RFC 9110 12.5.3: codings are weighed by their q-values (``*`` stands for
any coding not named), ``identity`` is acceptable unless refused
(``identity;q=0``, or ``*;q=0`` without a word on ``identity``), and among
equal weights the server's order (``cache.documents.variants.CODINGS``) decides. A
request without the header gets the stored bytes as they are: clients that
never asked for compression see no change. Parsing a header is cached by
its text (clients send a handful of distinct values), so a read pays a
dictionary lookup (``Negotiator``, one per worker).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from cache.documents.variants import CODINGS
from cache.fill_guard import keep_bounded

IDENTITY = "identity"
# The codings a request accepts, best first, "identity" among them where it
# is acceptable; an empty tuple accepts nothing we can send.
Preference = Tuple[str, ...]
AS_STORED: Preference = (IDENTITY,)
_MAX_REMEMBERED = 256


class Negotiator:
    """Parses ``Accept-Encoding`` headers, remembering the last few hundred it saw."""

    def __init__(self) -> None:
        self._remembered: Dict[str, Preference] = {}

    def preference(self, header: Optional[str]) -> Preference:
        """The codings ``header`` accepts, best first."""
        if header is None:
            return AS_STORED
        known = self._remembered.get(header)
        if known is None:
            known = _parse(header)
            keep_bounded(self._remembered, header, known, _MAX_REMEMBERED)
        return known


def choose(accepted: Preference, encoded: Sequence[Tuple[str, bytes]]) -> Optional[str]:
    """The first accepted coding that is ``identity`` or among the ``encoded`` variants; None if none is."""
    for coding in accepted:
        if coding == IDENTITY or any(name == coding for name, _ in encoded):
            return coding
    return None


def _parse(header: str) -> Preference:
    weights: Dict[str, float] = {}
    for item in header.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        if coding:
            weights[coding] = _q_value(params)
    anything = weights.get("*")
    ranked = []
    for order, coding in enumerate((*CODINGS, IDENTITY)):
        weight = weights.get(coding, anything)
        if weight is None:
            weight = 1.0 if coding == IDENTITY else 0.0
        if weight > 0:
            ranked.append((-weight, order, coding))
    return tuple(coding for _, _, coding in sorted(ranked))


def _q_value(params: str) -> float:
    """The ``q`` of a coding's parameters; a malformed one counts as 1 (be lenient in what is read)."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return 1.0
            return min(max(weight, 0.0), 1.0)
    return 1.0
