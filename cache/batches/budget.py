"""The byte budget of a batch's answer: what its gets may read, and what all its results may carry.

``JETWAY_MAX_RESPONSE_BYTES`` (``cache.documents.bounded_reads``) bounds the
documents one answer carries. In a batch, gets bring documents, and so do
writes: a put's, create's or patch's result carries the document stored
(unless ``Prefer: return=minimal``), and a small merge patch of a 1 MiB
document answers that 1 MiB. Gets are admitted before they are read
(``admitted_gets``: they are never read past the budget); every result is
then counted in order as its segment settles (``AnswerBudget``). Past the
budget, a get answers its own 413 and a write, which did happen, answers
its status and ETag with ``document_omitted`` (a 413 problem) instead of
its document: a write is never refused nor undone for its result's size.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from cache.batches.operations import CREATE, DELETE, GET, PATCH, PUT, OperationResult
from cache.documents.bounded_reads import OverBudget
from cache.documents.store import Document


class AnswerBudget:
    """The bytes of documents a batch's results carry, spent in order of the operations.

    A get's document past the budget is dropped and the get answers its own
    413 (``OverBudget``); a write's result keeps its status and ETag and
    leaves its document out (``omitted``): the write happened, and its
    result says so. Results are spent segment by segment, as they settle,
    so a batch of patches never holds more merged documents than this.
    """

    def __init__(self, budget: int, minimal: bool) -> None:
        self.budget = budget
        self.minimal = minimal
        self.spent = 0

    def spend(self, results: Sequence[OperationResult]) -> None:
        for result in results:
            document = result.document
            if document is None or result.error is not None or (self.minimal and result.operation.op != GET):
                continue
            size = len(document.body)
            if self.spent + size <= self.budget:
                self.spent += size
                continue
            problem = OverBudget(self.spent + size, self.budget, self._detail(result, self.spent + size))
            if result.operation.op == GET:
                result.document, result.error = None, problem
            else:
                result.document, result.omitted = Document(b"", document.etag, document.last_modified), problem

    def _detail(self, result: OperationResult, total: int) -> str:
        what = "this get's document" if result.operation.op == GET else "this write's document (it was written)"
        return (
            f"with {what}, the documents of the batch's results add up to {total} bytes; one answer carries"
            f" at most {self.budget} (JETWAY_MAX_RESPONSE_BYTES): split the batch"
        )


def admitted_gets(
    results: List[OperationResult], measured: Dict[Tuple[bytes, bytes], int], budget: int, minimal: bool
) -> Dict[int, int]:
    """Admit gets in order while they fit ``budget``; the caps of the admitted, by ``id`` of their result.

    A put's or create's document counts too (its result carries it, unless
    ``minimal``); a patch's is counted once it is merged, by ``AnswerBudget``.

    A get counts its document as measured, or as an earlier operation of
    the batch leaves it (a patch's merged size is known only once it runs:
    it counts as the largest). What is left of the budget is shared between
    the admitted gets, so a document may grow a little meanwhile.
    """
    sizes = dict(measured)
    spent = 0
    admitted: List[Tuple[OperationResult, int]] = []
    for result in results:
        operation = result.operation
        target = (operation.collection, operation.doc_id)
        size = sizes.get(target, 0)  # a get's document, as measured or as an earlier write leaves it
        if operation.op in (PUT, CREATE):
            sizes[target] = len(operation.body or b"")
            spent += 0 if minimal else sizes[target]  # its result carries it (AnswerBudget)
        elif operation.op == PATCH:
            sizes[target] = operation.max_size
        elif operation.op == DELETE:
            sizes[target] = 0
        elif spent + size > budget:
            total = spent + size
            result.error = OverBudget(
                total,
                budget,
                f"with this get, the documents of the batch's gets add up to {total} bytes; one answer"
                f" carries at most {budget} (JETWAY_MAX_RESPONSE_BYTES): split the batch",
            )
        else:
            spent += size
            admitted.append((result, size))
    share = (budget - spent) // max(len(admitted), 1)
    return {id(result): size + share for result, size in admitted}
