"""``POST /v1/_get/{coll}``: many documents by id, the ids in a JSON body.

The GET form (``?ids=a,b``) is bounded by the request line (8 KiB: about 60
ids of the longest kind); a body holds the whole allowed list
(``JETWAY_MAX_IDS``). The answer is the GET form's, byte for byte, composed
from the stored bytes, within the same byte budget (413
``response-too-large`` past it). Reading by POST needs read scope only.
"""

from __future__ import annotations

from typing import Any, List, Optional

from twisted.internet import defer

from cache.collection_settings import CollectionSettings
from handlers.collections import ComposedHandler
from handlers.http import validation
from handlers.ownership import bound_owner, only_owned
from handlers.pipeline import then


class MultiGetHandler(ComposedHandler):
    ROUTE = "multi_get"

    def post(self, collection: str) -> defer.Deferred:
        name = validation.collection_name(collection)
        body = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, self.max_body
        )
        ids = validation.id_array(body, self.max_ids)
        reading = self.store.get_many(name, ids, self.response_budget)
        return self.with_collection_policy(name, reading).addCallback(
            lambda bodies: then(self.settings_now(name), self._send_visible, bodies)
        )

    def _send_visible(self, settings: CollectionSettings, bodies: List[Optional[Any]]) -> None:
        """The bodies, others' documents as missing ones when the collection's owner rule binds the caller."""
        owner = bound_owner(self.grant, settings)
        self._send(bodies if owner is None else only_owned(bodies, settings.owner, owner))

    def _send(self, bodies: List[Optional[Any]]) -> None:
        self.send_items(bodies)
