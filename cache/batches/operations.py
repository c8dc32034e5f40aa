"""The operations of a batch and their results, as ``cache.batches.batch`` runs them.

Kept apart from the runner so that ``cache.batches.budget``, which counts the
bytes the results carry, and the runner can both name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Tuple

from cache.documents.store import NO_CONDITIONS, Conditions, Document
from cache.documents.write_plan import Planner
from cache.indexes.declared import NO_INDEX_ARGS
from cache.ownership import OwnedReads

if TYPE_CHECKING:
    from cache.documents.bounded_reads import OverBudget

GET, PUT, CREATE, PATCH, DELETE = "get", "put", "create", "patch", "delete"
WRITES = frozenset({PUT, CREATE, PATCH, DELETE})


@dataclass(frozen=True)
class Operation:
    """One operation of a batch, checked and ready: ids, bodies and ETags as they will be written."""

    op: str
    collection: bytes
    doc_id: bytes  # for a create, the id chosen for it
    body: Optional[bytes] = None  # put, create
    patch: Any = None  # patch: the parsed merge patch
    conditions: Conditions = NO_CONDITIONS
    ttl: bytes = b""  # b"" keeps the expiry, b"0" removes it, b"N" sets it
    etag: Optional[bytes] = None  # the ETag a write stores (planned: a retry writes the same)
    max_size: int = 1 << 20  # of a patch's merged document
    planner: Optional[Planner] = None  # a patch's: its merged document's plan, or the exception refusing it
    replicas: Optional[int] = None  # the collection's own write_replicas (None: the deployment's)
    indexed: Tuple[Any, ...] = NO_INDEX_ARGS  # a put's entries in its collection's indexes (cache.indexes.declared)
    owned: Optional[OwnedReads] = None  # a bound caller's get: only its own document, another's a missing one


@dataclass
class OperationResult:
    """What one operation got: a document (gets and writes), nothing (deletes), or an error."""

    operation: Operation
    document: Optional[Document] = None
    created: Optional[bool] = None
    error: Optional[BaseException] = None
    written: bool = field(default=False)  # reached Redis as a write that took effect
    # A write's document left out of its result: the batch's answer had no room left (AnswerBudget).
    omitted: Optional[OverBudget] = None
