"""Per-document rules: a collection's ``owner`` setting, and who a request writes and reads as.

In the settings (``PUT /v1/_collections/{coll}``)::

    "owner": {"pointer": "/owner", "claim": "sub", "bypass": ["admin", "service"], "fill": true}

- ``pointer``: the document member that names its owner (a JSON Pointer to
  a string member).
- ``claim``: the caller's identity claim it must equal (``sub`` by default;
  any string claim of a verified OpenID Connect token).
- ``bypass``: who the rule does not bind: ``service`` (Jetway's own opaque
  tokens: services and the admin CLI), ``admin`` (a token or a user with
  the ``admin`` scope), or any scope (``read:*``, ``write:orders``). By
  default ``["admin", "service"]``.
- ``fill``: a create whose document lacks the member gets it from the
  claim (``true`` by default); without it, such a create is refused.

Declaring the rule declares an index on the member (``OWNER_INDEX``, field
``OWNER_FIELD``), so a user's page is a query on it, never a scan, and a
read of many documents by id keeps another's out before any byte of it is
counted (``OwnedReads``).

A request is bound by the rule when its caller has an identity (a verified
JWT) and no bypassing grant; it then acts as ``Owner(value)``: the claim's
value, a string. Authorization off, or an opaque token, binds nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from cache.indexes.declared import Index, IndexField
from cache.indexes.values import STRING, encode, member, pointer_tokens

OWNER_INDEX = "owner_rule"
OWNER_FIELD = "_owner"
SERVICE = "service"
ADMIN = "admin"
DEFAULT_BYPASS = (ADMIN, SERVICE)
_MEMBERS = frozenset({"pointer", "claim", "bypass", "fill"})
MAX_OWNER_BYTES = 256


class OwnerRuleError(ValueError):
    """An ``owner`` setting that cannot be stored; the message says which member and why."""


@dataclass(frozen=True, eq=False)
class OwnerRule:
    """A collection's per-document rule (see the module)."""

    pointer: str
    tokens: Tuple[str, ...]
    claim: str = "sub"
    bypass: Tuple[str, ...] = DEFAULT_BYPASS
    fill: bool = True

    @property
    def index(self) -> Index:
        """The index the rule declares: the owner member, as a string, under ``OWNER_FIELD``."""
        return Index(OWNER_INDEX, (IndexField(OWNER_FIELD, self.pointer, self.tokens, STRING),))

    @functools.cached_property
    def index_state(self) -> bytes:
        """The index in a shard's states (``<name>:<version>``), found once per rule (its version is a digest)."""
        return f"{OWNER_INDEX}:{self.index.version}".encode()

    def reads_of(self, owner: str, sees: Callable[[Any], bool]) -> OwnedReads:
        """What reads of many documents by ``owner`` (a bound caller's) see: ``OwnedReads``."""
        value = encode(owner, STRING) if owner != NOBODY else None
        # NOBODY's entries match none: every entry holds its value's end (two NULs) before the id, and no id a NUL.
        return OwnedReads(self.index_state, value or b"", sees)

    def owner_in(self, document: Any) -> Optional[str]:
        """The document's owner (parsed JSON): the member's value if it is a non-empty string, else None."""
        value = member(document, self.tokens)
        return value if isinstance(value, str) and value else None

    def binds(self, scopes: Sequence[str], claims: Optional[Mapping[str, Any]]) -> Optional[str]:
        """The owner a caller with ``scopes`` and ``claims`` (None: an opaque token) acts as; None: not bound.

        A caller with an identity but without the claim (or with a claim
        that is not a string) is bound to an owner no document has: it sees
        nothing and writes nothing, rather than everything.
        """
        if claims is None:
            return None if SERVICE in self.bypass else NOBODY
        if any(scope in self.bypass for scope in scopes):
            return None
        value = claims.get(self.claim)
        return value if isinstance(value, str) and 0 < len(value.encode()) <= MAX_OWNER_BYTES else NOBODY


@dataclass(frozen=True)
class OwnedReads:
    """What a bound caller's reads of many documents by id see: the documents whose owner entry is theirs.

    A document's entry in the rule's index is kept in its own hash, beside
    its body, by the scripts that write either (``cache.indexes.scripts``).
    A read that compares it there (``cache.documents.bounded_reads``,
    ``cache.batches.batch``) leaves another's document out before anything
    of it is measured, counted or sent: it is a missing one in every byte
    budget and every answer, and no body is parsed to tell. The entry is the
    verdict a bound page's query trusts too. A shard where the index is not
    built yet (the rule was just declared) cannot tell: such a read fails
    ``IndexNotReady``, as a bound page does. ``sees`` judges a document the
    worker holds already (the hot cache's), by its body, as a single read does.
    """

    index: bytes  # the rule's index in a shard's states hash: ``<name>:<version>``
    value: bytes  # the owner as the index encodes it: an owned document's entry is this, then its id
    sees: Callable[[Any], bool]

    def entry(self, doc_id: bytes) -> bytes:
        """The entry the document ``doc_id`` holds when it is the owner's."""
        return self.value + doc_id


# The owner of a caller the rule binds but cannot name (no such claim; an opaque token not let by): no
# document's, since an empty member names no owner (``owner_in``), so such a caller sees and writes nothing.
NOBODY = ""


def owner_rule(value: Any) -> OwnerRule:
    """The ``owner`` member of settings, checked; ``OwnerRuleError`` says what is wrong."""
    if not isinstance(value, dict) or "pointer" not in value or set(value) - _MEMBERS:
        raise OwnerRuleError(
            'owner must be {"pointer": "/<member>", "claim": "sub", "bypass": ["admin", "service"], "fill": true}'
            " (only pointer is required)"
        )
    pointer = value["pointer"]
    if not isinstance(pointer, str) or len(pointer) > 256:
        raise OwnerRuleError("owner.pointer must be a JSON Pointer of up to 256 characters")
    try:
        tokens = pointer_tokens(pointer)
    except ValueError as error:
        raise OwnerRuleError(f"owner.pointer: {error}") from None
    claim = value.get("claim", "sub")
    if not isinstance(claim, str) or not 0 < len(claim) <= 64:
        raise OwnerRuleError("owner.claim must be the name of a claim (1-64 characters)")
    bypass = value.get("bypass", list(DEFAULT_BYPASS))
    if not isinstance(bypass, list) or not all(isinstance(grant, str) and 0 < len(grant) <= 72 for grant in bypass):
        raise OwnerRuleError('owner.bypass must be a list of grants: "admin", "service" or scopes such as "read:*"')
    fill = value.get("fill", True)
    if not isinstance(fill, bool):
        raise OwnerRuleError("owner.fill must be true or false")
    return OwnerRule(pointer, tokens, claim, tuple(bypass), fill)
