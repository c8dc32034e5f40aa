"""``Idempotency-Key`` on POST, PATCH and the batch: a retry gets the first answer, never a second write.

The steps and why they are safe are in ``cache.documents.idempotency``. Here: the
header (an RFC 8941 string, quoted as the draft has it, or bare), the
fingerprint of the request, and what each outcome of a claim answers:

- done before, the same request: the stored response, with
  ``Idempotency-Replayed: true``;
- done or running, a different request under the same key: 422
  ``idempotency-key-reused``;
- running (the first attempt has not finished, or its worker died and its
  lease has not ended): 409 ``idempotency-key-in-use`` with ``Retry-After``;
- otherwise this attempt carries the request out with the claim's plan.

What is kept: the responses of requests that reached the store, 2xx and the
store's own refusals alike (404, 409, 412, 413, 422), so a retry learns
what the first attempt learnt. Not kept: refusals before the claim (the
request's own shape, authorization, rate), which leave no record, and
Redis trouble (5xx), which leaves the claim running so that a retry after
its lease carries out the same plan.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Optional, Tuple

from twisted.internet import defer

from cache.documents.idempotency import DONE, MISMATCH, RUNNING, IdempotencyRecords, StoredResponse, fingerprint
from cache.json import codec
from handlers.base import as_api_error
from handlers.http.errors import ApiError, bad_request

HEADER = "Idempotency-Key"
REPLAYED = "Idempotency-Replayed"
# sf-string characters (printable ASCII but " and \), quoted or not, 1 to 255 of them.
_KEY = re.compile(r'("?)([\x20\x21\x23-\x5b\x5d-\x7e]{1,255})\1\Z')
# Statuses a retry should see again: the request reached the store and this was its answer.
_KEPT = frozenset({200, 201, 204, 404, 409, 412, 413, 422})

Execute = Callable[[bytes], defer.Deferred]  # plan -> StoredResponse


def idempotency_key(header: Optional[str]) -> Optional[str]:
    """The key of an ``Idempotency-Key`` header, None without one; 400 if it is not one."""
    if header is None:
        return None
    match = _KEY.match(header.strip())
    if not match or not match.group(2).strip():
        raise bad_request(
            "Idempotency-Key must be a string of 1 to 255 printable ASCII characters, quoted or not",
            "invalid-idempotency-key",
        )
    return match.group(2)


@defer.inlineCallbacks
def carry_out(
    records: IdempotencyRecords, token_digest: bytes, key: str, request: Any, plan: bytes, execute: Execute
) -> Any:
    """The response to ``request`` under ``key``: replayed, refused, or made by ``execute(plan)``.

    ``plan`` is used only if this attempt is the first; one that takes an
    ended lease over gets the first attempt's plan, and ``execute`` must
    then write with it (ETags and ids), which finds done what was done.
    """
    mark = fingerprint(request.method, request.uri, request.headers.get("Content-Type"), request.body)
    claim = yield records.claim(token_digest, key, mark, plan)
    if claim.outcome == DONE:
        return replayed(claim.response)
    if claim.outcome == MISMATCH:
        raise ApiError(
            422,
            "idempotency-key-reused",
            "this Idempotency-Key was used for a different request (method, path or body); use a new key",
        )
    if claim.outcome == RUNNING:
        retry = str(max(1, round(claim.lease_left + 0.5)))
        raise ApiError(
            409,
            "idempotency-key-in-use",
            f"a request with this Idempotency-Key is still being carried out; retry in {retry} s",
            {"Retry-After": retry},
        )
    try:
        response = yield execute(claim.plan)
    except Exception as error:
        refusal = as_api_error(error)
        if refusal is not None and refusal.status_code in _KEPT:
            yield records.record(token_digest, key, problem_response(refusal))
        else:
            # A 5xx or 429 may come again or not: the retry runs (with this
            # plan, so what did reach Redis is found done), not a 409 until
            # the lease runs out. Best effort: if Redis is gone, it runs out.
            yield records.end_lease(token_digest, key, claim.owner).addErrback(lambda _: None)
        raise
    if response.status in _KEPT:
        yield records.record(token_digest, key, response)
    else:
        yield records.end_lease(token_digest, key, claim.owner).addErrback(lambda _: None)
    return response


@defer.inlineCallbacks
def respond_once(handler: Any, plan: bytes, execute: Execute, writes: Iterable[Tuple[bytes, bytes]] = ()) -> Any:
    """Send ``execute(plan)``'s response, or, under an ``Idempotency-Key``, what that key's first attempt got.

    ``handler`` is a ``ResourceHandler`` whose request was admitted; its
    records are per token (``b""`` with authorization off). ``writes``:
    the (collection, id) of the documents the request writes; a replay
    drops their hot-cache entries, as the first attempt's worker did, so
    that the client then reads what it wrote on this worker too.
    """
    key = idempotency_key(handler.request.headers.get(HEADER))
    if key is None:
        response = yield execute(plan)
    else:
        digest = handler.grant.record.digest if handler.grant.record is not None else b""
        response = yield carry_out(handler.idempotency, digest, key, handler.request, plan, execute)
        if (REPLAYED, "true") in response.headers:
            for target in writes:
                handler.store.forget(*target)
    handler.send_stored(response)


def replayed(response: Optional[StoredResponse]) -> StoredResponse:
    assert response is not None
    return StoredResponse(response.status, (*response.headers, (REPLAYED, "true")), response.body)


def problem_response(error: ApiError) -> StoredResponse:
    """A problem as it is sent (``handlers.base`` renders the same members)."""
    headers: Tuple[Tuple[str, str], ...] = (("Content-Type", "application/problem+json"), *error.headers.items())
    return StoredResponse(error.status_code, headers, codec.dumps(error.as_problem()))
