"""The OpenAPI description of ``/v1/_collections``, and the whole document with it.

Kept apart from ``handlers.openapi`` (which it builds on) so that module
stays the generic API; ``api_document`` is what ``/openapi.json`` serves
before any collection's own paths are added (``handlers.openapi_collections``).
"""

from __future__ import annotations

from cache.collection_settings import MAX_REPLICAS, MAX_TTL
from cache.schema import DRAFT
from handlers.base import JSON_TYPE
from handlers.http import validation
from handlers.openapi import (
    _REDIS,
    Json,
    _body,
    _errors,
    _object,
    _operation,
    _parameters_named,
    _path_item,
    _ref,
    _response,
    _secured,
    _with_head,
    openapi_document,
)

SETTINGS = "/v1/_collections/{collection}"
SETTINGS_LIST = "/v1/_collections"


def _settings_schema() -> Json:
    return _object(
        {
            "schema": {
                "type": "object",
                "additionalProperties": True,
                "description": f"A JSON Schema ({DRAFT}) every written document must match (PUT, POST, and the"
                " merged result of PATCH).",
            },
            "ttl": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TTL,
                "description": "Seconds a document lives when its write gives no `ttl`.",
            },
            "max_bytes": {"type": "integer", "minimum": 2, "description": "Largest document of the collection."},
            "cache_control": {
                "type": "string",
                "minLength": 1,
                "maxLength": 256,
                "description": "The `Cache-Control` of the collection's document reads and list pages, in place of"
                " `JETWAY_CACHE_CONTROL` (the same directives are accepted; stored normalized).",
            },
            "write_replicas": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_REPLICAS,
                "description": "Replicas that must have a write before it is answered (instead of"
                " `JETWAY_WRITE_REPLICAS`).",
            },
        },
        (),
        "A collection's settings; every member is optional, and an absent one changes nothing.",
    )


def _schemas() -> Json:
    listed = _object(
        {
            "items": {
                "type": "array",
                "items": _object(
                    {
                        "collection": _ref("schemas", "CollectionName"),
                        "etag": {"type": "string"},
                        "settings": _ref("schemas", "CollectionSettings"),
                    },
                    ["collection", "etag", "settings"],
                    "One collection's settings.",
                ),
            }
        },
        ["items"],
        "Every collection that has settings, by name.",
    )
    return {"CollectionSettings": _settings_schema(), "CollectionSettingsList": listed}


def _paths() -> Json:
    stored = _response("The settings as stored.", _ref("schemas", "CollectionSettings"), ("ETag",))
    admin = {"e403": "The token lacks the `admin` scope."}
    get = _operation(
        "getCollectionSettings",
        "A collection's settings",
        "settings",
        {
            "200": stored,
            "304": _response("`If-None-Match` matches the current ETag.", headers=("ETag",)),
            **_errors(
                (400, 404, *_REDIS), e400="Invalid collection name.", e404="The collection has no settings.", **admin
            ),
        },
        parameters=_parameters_named("If-None-Match"),
    )
    put = _operation(
        "putCollectionSettings",
        "Set a collection's settings (every worker applies them within a second)",
        "settings",
        {
            "200": stored,
            "201": stored,
            **_errors(
                (400, 412, 413, 415, 422, *_REDIS),
                e400="Invalid collection name; malformed JSON; or not an object.",
                e412="`If-Match` does not match, or `If-None-Match: *` and settings exist.",
                e422="`invalid-schema`: not a Draft 2020-12 schema (the detail says why); `invalid-settings`: an"
                " unknown member or a value out of range.",
                **admin,
            ),
        },
        parameters=_parameters_named("If-Match", "If-None-Match"),
        requestBody=_body(JSON_TYPE, "The settings; they replace any before.", "CollectionSettings"),
    )
    delete = _operation(
        "deleteCollectionSettings",
        "Remove a collection's settings (its documents stay)",
        "settings",
        {
            "204": _response("Removed."),
            **_errors(
                (400, 404, 412, *_REDIS), e400="Invalid collection name.", e404="No settings to remove.", **admin
            ),
        },
        parameters=_parameters_named("If-Match"),
    )
    listing = _operation(
        "listCollectionSettings",
        "Every collection's settings",
        "settings",
        {
            "200": _response("By collection name.", _ref("schemas", "CollectionSettingsList")),
            **_errors((400, *_REDIS), e400="Never, in fact: there is nothing to get wrong.", **admin),
        },
    )
    return {
        SETTINGS: _path_item(
            "A collection's settings (admin scope).",
            "CollectionSettings",
            _secured({**_with_head(get, "headCollectionSettings"), "put": put, "delete": delete}),
            ("collection",),
        ),
        SETTINGS_LIST: _path_item(
            "Every collection's settings (admin scope; a trailing slash is accepted).",
            "CollectionSettingsList",
            _secured(_with_head(listing, "headCollectionSettingsList")),
        ),
    }


def api_document(max_ids: int = validation.MAX_IDS, with_docs: bool = True, max_wait: int = 60) -> Json:
    """``handlers.openapi.openapi_document`` with the collection-settings routes."""
    spec = openapi_document(max_ids, with_docs, max_wait)
    spec["paths"].update(_paths())
    spec["components"]["schemas"].update(_schemas())
    return spec
