"""``/v1/_collections/{coll}`` and ``/v1/_collections``: collection settings (admin scope).

PUT stores a collection's settings (JSON Schema, default TTL, size limit,
cache policy, write replicas) after checking each and compiling the schema
(off the reactor thread: ``cache.schemas.versions``);
GET answers them as stored, with their ETag (and, when they declare
indexes, the ``Index-Builds`` header: each index's shards built, of all,
``by_email=16/16, by_age=5/16``); DELETE returns the collection
to no settings at all. ``If-Match`` (and ``If-None-Match: *`` on PUT) work
as on documents. Every worker hears of a change within a round trip
(``cache.settings_cache``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from twisted.internet import defer

from cache.collection_settings import CollectionSettings, SettingsError, stored_indexes
from cache.json import codec
from cache.schemas.schema import InvalidSchema
from handlers.base import ResourceHandler
from handlers.http import validation
from handlers.http.cache_policy import cache_policy
from handlers.http.errors import ApiError, not_found, precondition_failed

ADMIN = "admin"


class CollectionSettingsHandler(ResourceHandler):
    ROUTE = "collection_settings"

    @defer.inlineCallbacks
    def get(self, collection: str) -> Any:
        name = validation.collection_name(collection).decode()
        row = yield self.collections.store.read(name)
        if row is None:
            raise not_found(f"collection {name} has no settings")
        body, etag = row
        indexes = stored_indexes(body)
        # A build or a sweep whose worker stopped (a restart, a failover) goes on from where it was.
        progress = yield self.store.index_builds.resume(name.encode(), indexes)
        if indexes:
            self.set_header("Index-Builds", index_builds_header(progress))
        inm = validation.entity_tags(self.request.headers.get("If-None-Match"), weak=True)
        self.set_header("ETag", etag)
        if inm == b"*" or etag in inm.split():
            self.set_status(304)
            return
        self.send_bytes(200, body)

    head = get

    @defer.inlineCallbacks
    def put(self, collection: str) -> Any:
        name = validation.collection_name(collection).decode()
        values = validation.json_document(
            self.request.body, self.request.headers.get("Content-Type"), validation.JSON, self.max_body
        )
        if isinstance(values.get("cache_control"), str):
            # Checked as JETWAY_CACHE_CONTROL is (handlers/http/cache_policy.py), and kept normalized.
            try:
                values["cache_control"] = cache_policy(values["cache_control"])
            except ValueError as error:
                raise ApiError(422, "invalid-settings", f"cache_control: {error}") from None
        try:
            stored: Optional[Tuple[CollectionSettings, bool]] = yield self.collections.put(
                name,
                values,
                validation.entity_tags(self.request.headers.get("If-Match"), weak=False),
                validation.entity_tags(self.request.headers.get("If-None-Match"), weak=True),
            )
        except InvalidSchema as error:
            raise ApiError(422, "invalid-schema", str(error)) from None
        except SettingsError as error:
            raise ApiError(422, "invalid-settings", str(error)) from None
        if stored is None:
            raise precondition_failed("the settings do not match the request's conditions")
        settings, created = stored
        # Indexes new to documents already there are built from here, in the background, and the fields of
        # dropped ones swept from the documents (cache.indexes.builds).
        self.store.index_builds.ensure(name.encode(), settings.indexes)
        self.store.index_builds.sweep(name.encode())
        self.set_header("ETag", settings.etag)
        self.send_bytes(201 if created else 200, settings.body)

    @defer.inlineCallbacks
    def delete(self, collection: str) -> Any:
        name = validation.collection_name(collection).decode()
        if_match = validation.entity_tags(self.request.headers.get("If-Match"), weak=False)
        result = yield self.collections.store.delete(name, if_match)
        if result == 0:
            raise precondition_failed("the settings do not match the request's conditions")
        if result == -1:
            raise not_found(f"collection {name} has no settings")
        self.store.index_builds.sweep(name.encode())  # its indexes went with its settings: their fields go too
        self.send_no_content()


def index_builds_header(progress: Dict[str, Dict[str, int]]) -> str:
    """``by_email=16/16, by_age=5/16``: each declared index's shards built, of all (16/16: it answers queries)."""
    return ", ".join(f"{name}={state['shards_built']}/{state['shards']}" for name, state in sorted(progress.items()))


class CollectionSettingsListHandler(ResourceHandler):
    ROUTE = "collection_settings_list"

    @defer.inlineCallbacks
    def get(self) -> Any:
        rows: List[Tuple[str, bytes, bytes]] = yield self.collections.store.read_all()
        # Stored bytes, unparsed, inside a small envelope (as list pages are made).
        items = b",".join(
            b'{"collection":'
            + codec.dumps(name)
            + b',"etag":'
            + codec.dumps(etag.decode())
            + b',"settings":'
            + body
            + b"}"
            for name, body, etag in rows
        )
        self.send_bytes(200, b'{"items":[' + items + b"]}")

    head = get
