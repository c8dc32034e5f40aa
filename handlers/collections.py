"""``/v1/{coll}``: create with a server-made id, list a page, get many.

List and multi-get bodies are put together from the stored bytes; no
document is parsed on the way out.
"""

from __future__ import annotations

from typing import Any, List, Optional

from twisted.internet import defer

from cache.errors import NotReplicated
from cache.store import Page
from handlers import validation
from handlers.base import ResourceHandler, as_api_error
from handlers.errors import bad_request


def items_envelope(bodies: List[Optional[bytes]], next_cursor: Optional[bytes], with_next: bool) -> bytes:
    """``{"items":[...]}`` (and ``"next"``) around stored bodies, unparsed."""
    items = b",".join(b"null" if body is None else body for body in bodies)
    if not with_next:
        return b'{"items":[' + items + b"]}"
    # A cursor is base64url, so it needs no JSON escaping.
    following = b'"' + next_cursor + b'"' if next_cursor else b"null"
    return b'{"items":[' + items + b'],"next":' + following + b"}"


def send_items(handler: ResourceHandler, bodies: List[Optional[bytes]]) -> None:
    """A multi-get's answer, by GET or by POST: the same bytes."""
    handler.send_bytes(200, items_envelope(bodies, None, with_next=False))


class CollectionHandler(ResourceHandler):
    ROUTE = "collection"
    SUPPORTED_METHODS = ("GET", "HEAD", "POST")

    def get(self, collection: str) -> defer.Deferred:
        # Plain callbacks, as the document GET (handlers/documents.py).
        name = validation.collection_name(collection)
        ids = self.query_arguments("ids")
        if ids:
            if self.query_argument("cursor") is not None:
                raise bad_request("ids cannot be combined with cursor", "invalid-ids")
            wanted = validation.id_list(ids, self.max_ids)
            validation.limit_beside_ids(self.query_argument("limit"), len(wanted))
            return self.store.get_many(name, wanted).addCallback(self._send_many)
        limit = validation.limit(self.query_argument("limit"))
        after = validation.decode_cursor(self.query_argument("cursor"))
        return self.store.page(name, limit, after).addCallback(self._send_page)

    def _send_many(self, bodies: List[Optional[bytes]]) -> None:
        send_items(self, bodies)

    def _send_page(self, page: Page) -> None:
        cursor = validation.encode_cursor(page.last_id) if page.last_id else None
        self.send_bytes(200, items_envelope(page.bodies, cursor, with_next=True))

    head = get

    @defer.inlineCallbacks
    def post(self, collection: str) -> Any:
        name = validation.collection_name(collection)
        value = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, self.max_body
        )
        ttl = validation.ttl(self.query_argument("ttl"))
        rules = yield self.collection_settings(name)
        rules.check(value, len(self.request.body))  # before anything is stored
        try:
            doc_id, document = yield self.store.create(
                name, self.request.body, rules.ttl_or_default(ttl), rules.write_replicas
            )
        except NotReplicated as error:
            # Stored on the primary under an id the client has not seen: say where.
            problem = as_api_error(error)
            assert problem is not None and error.doc_id is not None
            problem.headers["Location"] = f"/v1/{collection}/{error.doc_id.decode()}"
            raise problem from None
        self.set_header("Location", f"/v1/{collection}/{doc_id.decode()}")
        self.send_document(201, document)
