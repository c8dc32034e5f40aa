"""A document read: from the hot cache when it holds the document, else one ``HMGET``, filling it.

One of the parts ``cache.documents.store.DocumentStore`` is made of, given
the link and the hot cache it reads. The hot cache's rules (when a read may
fill it, when an entry goes) are stated in ``cache.hot.cache``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from twisted.internet import defer
from twisted.python.failure import Failure

from cache import keys
from cache.documents.document import Document, filling_read, read_key, stored_document
from cache.hot.cache import HotCache
from cache.redis.link import Link


class DocumentReads:
    """The document reads of ``DocumentStore``: one document, with or without a command along."""

    def __init__(self, link: Link, hot: Optional[HotCache]) -> None:
        self._link = link
        self._hot = hot

    # The two reads are the hot path: a plain callback costs less than an
    # inlineCallbacks generator (a Deferred, a context copy and a generator
    # per call on PyPy) and reads as well for one step.
    def get(self, collection: bytes, doc_id: bytes, fresh: bool = False) -> defer.Deferred:
        """The document, or None: from the hot cache, else one HMGET of one key.

        ``fresh``: from Redis even if cached (a request's ``Cache-Control: no-cache``).
        """
        found = self.get_or_wait(collection, doc_id, fresh)
        return defer.succeed(found) if isinstance(found, Document) else found

    def get_or_wait(self, collection: bytes, doc_id: bytes, fresh: bool = False) -> Union[Document, defer.Deferred]:
        """``get``, with a document the hot cache holds given at once rather than in a fired Deferred."""
        key = keys.document_key(collection, doc_id)
        hot = self._hot
        if hot is not None:
            document = None if fresh else hot.get(key)
            if document is not None:
                return document
            ticket = hot.reserve(key)
            if ticket is not None:
                return self._link.pipeline(filling_read(key)).addBoth(self._filled, key, ticket)
        return self._link.execute(*read_key(key)).addCallback(stored_document)

    def get_along(
        self,
        collection: bytes,
        doc_id: bytes,
        command: Sequence[Any],
        scripts: Sequence[Any],
        fresh: bool = False,
    ) -> defer.Deferred:
        """``command``'s reply and the document, in one round trip (command first).

        A document in the hot cache is not read: ``command`` goes alone.
        """
        key = keys.document_key(collection, doc_id)
        hot = self._hot
        if hot is not None:
            document = None if fresh else hot.get(key)
            if document is not None:
                return self._link.pipeline_scripts([command], scripts).addCallback(_along, document)
            ticket = hot.reserve(key)
            if ticket is not None:
                read = self._link.pipeline_scripts([command, *filling_read(key)], scripts)
                return read.addBoth(self._filled_along, key, ticket)
        read = self._link.pipeline_scripts([command, read_key(key)], scripts)
        return read.addCallback(lambda replies: (replies[0], stored_document(replies[1])))

    def cached(self, collection: bytes, doc_id: bytes) -> Optional[Document]:
        """The document if this worker's hot cache holds it (None: not held, or no cache)."""
        hot = self._hot
        return None if hot is None else hot.get(keys.document_key(collection, doc_id))

    def forget(self, collection: bytes, doc_id: bytes) -> None:
        """Drop the document's hot-cache entry: it has been written, here or elsewhere (a replay's)."""
        if self._hot is not None:
            self._hot.written(keys.document_key(collection, doc_id))

    def forgetting(self, sent: defer.Deferred, doc_keys: Sequence[bytes]) -> defer.Deferred:
        """``sent`` (writes of ``doc_keys``): their hot-cache entries go before its callbacks, whatever the outcome."""
        if self._hot is not None and doc_keys:
            sent.addBoth(_forgetting, self._hot, doc_keys)  # one callback for all: not one each (a batch's 100)
        return sent

    def _filled(self, replies: Any, key: bytes, ticket: int) -> Any:
        """A filling read's outcome: the document, offered to the hot cache."""
        hot = self._hot
        assert hot is not None
        if isinstance(replies, Failure):
            hot.release(key, ticket)
            return replies
        document = stored_document(replies[0])
        hot.fill(key, ticket, document, replies[1])
        return document

    def _filled_along(self, replies: Any, key: bytes, ticket: int) -> Any:
        if isinstance(replies, Failure):
            return self._filled(replies, key, ticket)
        return replies[0], self._filled(replies[1:], key, ticket)


def _along(replies: List[Any], document: Document) -> Tuple[Any, Document]:
    return replies[0], document


def _forgetting(result: Any, hot: HotCache, doc_keys: Sequence[bytes]) -> Any:
    for key in doc_keys:
        hot.written(key)
    return result
