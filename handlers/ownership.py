"""Per-document rules at work: whom a request acts as, what it may see, and how its writes are pinned.

A collection's ``owner`` setting (``cache.ownership``) binds every
caller with an identity (an OpenID Connect token) that no bypassing grant
lets by. Such a caller:

- sees a document only if its owner member names them: another user's
  document is answered exactly as a missing one (404, a multi-get's
  ``null``), so existence is not told; where many are read at once (a
  multi-get, a batch's gets) another's is left out before the answer's
  byte budget counts it (``owned_reads``), so neither is its size;
- writes only documents it owns, and only as their owner: a new document's
  owner member must name the writer (or is filled in from the claim when
  the rule says ``fill``), and no write may change it;
- lists and queries only its own documents: a page is a query on the
  rule's index, never a scan.

A write is pinned: the document is read first (from Redis, not the hot
cache), its owner checked and the request's own conditions judged against
it, and the write is then sent with the condition that the document is
still that one (``If-Match`` its ETag, or ``If-None-Match: *`` when it did
not exist). A write by someone else in between fails the condition: the
request is answered 412, and nothing of the other's document is written.

Operations not yet made rule-aware refuse a bound caller (403) rather than
show or change what the rule hides (``refuse_bound``).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from cache.collection_settings import CollectionSettings
from cache.documents.document import Conditions, Document, PreconditionFailed, epoch_of, tag_matches
from cache.documents.write_plan import Planner, WritePlan
from cache.indexes.values import MISSING, member
from cache.json import codec
from cache.ownership import NOBODY, OwnedReads, OwnerRule
from handlers.http.auth import Grant
from handlers.http.errors import ApiError


def bound_owner(grant: Optional[Grant], settings: CollectionSettings) -> Optional[str]:
    """The owner ``grant``'s caller acts as in this collection; None when its rule (if any) does not bind them."""
    rule = settings.owner
    if rule is None or grant is None or grant.record is None:
        return None
    identity = grant.record.identity
    return rule.binds(grant.record.scopes, identity.claims if identity is not None else None)


def visible(rule: OwnerRule, owner: str, body: Optional[Any]) -> bool:
    """Whether the stored ``body`` (bytes, or a view of a composed read's) is ``owner``'s; unreadable: no one's."""
    if body is None:
        return False
    return owner != NOBODY and _owner_of(rule, body if isinstance(body, bytes) else bytes(body)) == owner


def visible_document(rule: OwnerRule, owner: str, document: Document) -> bool:
    """Whether ``document`` is ``owner``'s: ``visible`` once per document and rule, remembered on the document."""
    found = document.owner_found
    if found is None or found[0] is not rule:
        found = (rule, _owner_of(rule, document.body))
        object.__setattr__(document, "owner_found", found)  # a memo on a frozen value (see Document)
    return owner != NOBODY and found[1] == owner


def _owner_of(rule: OwnerRule, body: bytes) -> Optional[str]:
    try:
        return rule.owner_in(codec.loads(body))
    except codec.JsonError:
        return None  # unreadable: no one's


def owned_document(rule: OwnerRule, owner: str, value: Any, body: bytes) -> Tuple[Any, bytes]:
    """A new representation written by ``owner``: its owner member filled in if the rule says so, or refused.

    Returns the value and the bytes to store (new bytes only when filled in).
    """
    if owner == NOBODY:
        raise ApiError(403, "forbidden", f"the token names no {rule.claim}, which this collection's owner rule needs")
    found = member(value, rule.tokens)
    if found is MISSING:
        parent = member(value, rule.tokens[:-1]) if len(rule.tokens) > 1 else value
        if not rule.fill or not isinstance(parent, dict):
            raise ApiError(
                422, "owner-missing", f"the document must name its owner at {rule.pointer} (this collection's rule)"
            )
        parent[rule.tokens[-1]] = owner
        return value, codec.dumps(value)
    if found != owner:
        raise ApiError(
            403, "forbidden", f"{rule.pointer} must name the writer: a document cannot be given to another owner"
        )
    return value, body


def pinned(conditions: Conditions, current: Optional[Document]) -> Conditions:
    """The request's own ``If-Match`` / ``If-None-Match`` judged against ``current`` (``PreconditionFailed``),
    and the conditions that keep the write to that very document (its ETag, or its absence)."""
    etag = current.etag if current is not None else None
    if conditions.if_match and not (etag is not None and tag_matches(conditions.if_match, etag)):
        raise PreconditionFailed()
    if conditions.if_none_match and (etag is not None and tag_matches(conditions.if_none_match, etag)):
        raise PreconditionFailed()
    if current is None:
        return Conditions(b"", b"*")
    since = conditions.unmodified_since
    if since is not None and not conditions.if_match and epoch_of(current.last_modified) > since:
        raise PreconditionFailed()  # RFC 9110 13.2.2: only without If-Match, only for a document that exists
    return Conditions(current.etag, b"")


def keeping_owner(rules: CollectionSettings, owner: str, planner: Planner) -> Planner:
    """A merge patch's planner that refuses a merged document whose owner member is no longer ``owner``."""
    rule = rules.owner
    assert rule is not None

    def plan(value: Any, size: int) -> WritePlan:
        if rule.owner_in(value) != owner:
            raise ApiError(403, "forbidden", f"a patch cannot change or remove {rule.pointer} (the owner)")
        return planner(value, size)

    return plan


def owned_reads(settings: CollectionSettings, owner: str) -> OwnedReads:
    """What ``owner``'s reads of many documents see (a multi-get's, a batch's gets): another's document is left
    out in Redis, before any budget counts it, as a missing one (``cache.ownership.OwnedReads``)."""
    rule = settings.owner
    assert rule is not None
    return rule.reads_of(owner, lambda document: visible_document(rule, owner, document))


def refuse_bound(grant: Optional[Grant], settings: CollectionSettings, what: str) -> None:
    """A 403 for a caller this collection's owner rule binds, on an operation that does not apply the rule yet."""
    if bound_owner(grant, settings) is not None:
        raise ApiError(
            403, "forbidden", f"{what} is not available to a user bound by this collection's owner rule (yet)"
        )
