"""``POST /v1/_get/{coll}``: many documents by id, the ids in a JSON body.

The GET form (``?ids=a,b``) is bounded by the request line (8 KiB: about 60
ids of the longest kind); a body holds the whole allowed list
(``JETWAY_MAX_IDS``). The answer is the GET form's, byte for byte, composed
from the stored bytes, within the same byte budget (413
``response-too-large`` past it). Reading by POST needs read scope only.
A caller bound by the collection's owner rule reads as the GET form's does
(``handlers.ownership.owned_reads``): another's document is a missing one,
in the budget too.
"""

from __future__ import annotations

from typing import Any, List

from twisted.internet import defer

from cache.collection_settings import CollectionSettings
from handlers.collections import ComposedHandler
from handlers.http import validation
from handlers.http.cache_policy import policy_for
from handlers.ownership import bound_owner, owned_reads
from handlers.pipeline import then


class MultiGetHandler(ComposedHandler):
    ROUTE = "multi_get"

    def post(self, collection: str) -> defer.Deferred:
        name = validation.collection_name(collection)
        body = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, self.max_body
        )
        ids = validation.id_array(body, self.max_ids)
        return then(self.settings_now(name), self._read, name, ids)

    def _read(self, settings: CollectionSettings, name: bytes, ids: List[bytes]) -> defer.Deferred:
        """The documents as the caller may see them: the owner rule's (if it binds) applied as they are read."""
        self.cache_control = policy_for(settings.cache_control, self.cache_control)
        owner = bound_owner(self.grant, settings)
        owned = None if owner is None else owned_reads(settings, owner)  # another's: as a missing one
        return self.store.get_many(name, ids, self.response_budget, owned).addCallback(self._send)

    def _send(self, bodies: List[Any]) -> None:
        self.send_items(bodies)
