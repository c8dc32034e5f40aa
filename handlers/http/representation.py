"""What a read of one stored document answers, chosen from the request's headers.

Negotiation comes first (RFC 9110 13.2.2: preconditions apply to the
selected representation): the stored variant the client accepts best, or a
406 when it accepts none. Then ``If-None-Match`` with any variant's tag, or
else ``If-Modified-Since``, turns the answer into a 304. The document read's
pipeline (``handlers.document_answers``) asks it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from cache.documents.store import Document
from cache.documents.variants import variant_tag
from handlers.http import conditional, validation
from handlers.http.errors import ApiError
from handlers.http.negotiation import IDENTITY, Preference, choose


class Representation:
    """The answer to a read: 200 with ``body`` (in ``coding``), or 304; ``etag`` is the tag to send."""

    __slots__ = ("body", "coding", "etag", "status", "vary")

    def __init__(self, status: int, etag: bytes, coding: str, body: bytes, vary: bool) -> None:
        self.status = status
        self.etag = etag
        self.coding = coding
        self.body = body
        # The document has stored variants: the answer depends on Accept-Encoding.
        self.vary = vary


def negotiate(accepted: Preference, encoded: Sequence[Tuple[str, bytes]]) -> str:
    """The coding to answer in, among identity and ``encoded``'s; a 406 ``ApiError`` if the client accepts none."""
    coding = choose(accepted, encoded)
    if coding is None:
        stored = ", ".join((IDENTITY, *(name for name, _ in encoded)))
        raise ApiError(406, "not-acceptable", f"Accept-Encoding refuses every coding available ({stored})")
    return coding


def represent(document: Document, headers: Any, accepted: Preference) -> Representation:
    """The representation of ``document`` a request with ``headers`` gets; raises a 406 ``ApiError``."""
    coding = negotiate(accepted, document.encoded)
    vary = bool(document.encoded)
    etag = document.etag if coding == IDENTITY else variant_tag(document.etag, coding)
    matched = _not_modified_tag(document, etag, headers)
    if matched is not None:
        return Representation(304, matched, coding, b"", vary)
    body = document.body if coding == IDENTITY else document.variant(coding)
    return Representation(200, etag, coding, body, vary)  # type: ignore[arg-type]


def _not_modified_tag(document: Document, etag: bytes, headers: Any) -> Optional[bytes]:
    """The tag a 304 carries when the request's preconditions say the client's copy is current; else None."""
    if_none_match = headers.get("If-None-Match")
    if if_none_match is not None:
        return conditional.matching_tag(validation.entity_tags(if_none_match, weak=True), document.etag, etag)
    if not conditional.modified_since(document.last_modified, headers.get("If-Modified-Since")):
        return etag
    return None
