"""One write plan: a collection's settings applied to a write's new document, for every way of writing one.

A PUT, a POST, a PATCH (its merged document), a batch's put, create or
patch and an import's line each ask ``plan_write`` what their settings make
of the new document: refused (the schema's verdict, the collection's size
limit, settings this version cannot apply: the exception says which), or
a ``WritePlan`` with the expiry, the write concern and the index entries
the store writes it with. A rule a write must obey is added here once, and
every entry point obeys it.

The expiry rule, once: a write that gives a TTL sets it; one that gives none
gets the collection's default TTL, and without a default its document has
no expiry (a replace clears an earlier one, as a PUT of a new representation
should); a merge patch keeps the document's expiry.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

from cache.collection_settings import CollectionSettings
from cache.indexes.declared import NO_INDEX_ARGS, index_args

# The expiry as the write scripts take it: b"N" sets N seconds, b"0" removes an expiry, b"" keeps it.
KEEP_EXPIRY = b""
NO_EXPIRY = b"0"


class WritePlan(NamedTuple):
    """How the store writes one document: its expiry, its write concern, its entries in the collection's indexes.

    A tuple, made once per write: a frozen dataclass costs a ``__setattr__`` per field on PyPy.
    """

    expiry: bytes = NO_EXPIRY
    replicas: Optional[int] = None  # the collection's own write concern (None: the deployment's)
    indexed: Tuple[Any, ...] = NO_INDEX_ARGS


PLAIN = WritePlan()  # no expiry, the deployment's write concern, no entries given (Redis makes them)
KEPT = WritePlan(KEEP_EXPIRY)  # a patch's when no planner is given: its document's expiry kept

# What a PATCH's store call asks of its merged document: its plan, or the exception that refuses it.
Planner = Callable[[Any, int], WritePlan]


def plan_write(
    rules: CollectionSettings, value: Any, size: int, doc_id: bytes, ttl: Optional[int] = None, patch: bool = False
) -> WritePlan:
    """The plan of writing ``value`` (``size`` bytes) as ``doc_id``, or the exception that refuses it.

    ``ttl``: the request's own (None: none given); ``patch``: a merge patch's
    merged document, which keeps the document's expiry.
    """
    rules.check(value, size)
    return WritePlan(
        KEEP_EXPIRY if patch else expiry(rules, ttl),
        rules.write_replicas,
        index_args(rules.indexes, value, doc_id) if rules.indexes else NO_INDEX_ARGS,
    )


def expiry(rules: CollectionSettings, ttl: Optional[int]) -> bytes:
    """A write's expiry: its TTL, else the collection's default, else none (an earlier one is cleared)."""
    return b"%d" % (rules.ttl_or_default(ttl) or 0)


def keeping(rules: CollectionSettings) -> WritePlan:
    """A delete's plan, or a patch's before its merge: the collection's write concern, the expiry kept."""
    return WritePlan(KEEP_EXPIRY, rules.write_replicas)


def patch_planner(rules: CollectionSettings, doc_id: bytes) -> Planner:
    """The plan a merge patch's merged document is written with, made once it is merged (``store.patch``)."""
    return lambda value, size: plan_write(rules, value, size, doc_id, patch=True)
