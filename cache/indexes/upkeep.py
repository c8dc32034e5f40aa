"""Every worker hears of each collection's settings change, and the index work it calls for starts at once.

A change (through the API or the CLI, on any instance) is published on
``cache.collection_settings.CHANGED_CHANNEL`` twice: when the settings are
stored, and again once every index shard has their indexes' spec. At each
message, every worker reads the collection's stored indexes and resumes
their builds and the sweep of dropped indexes' fields
(``IndexBuilds.resume``); one of them takes each lease and does the work,
the others find it taken. So an index declared by the CLI is built without
waiting for a query to meet it, and a dropped index's fields leave the
documents without waiting for a look at the settings. Whatever a worker
misses (its subscription was down, it died mid-build) the next query that
meets the index unbuilt, or the next ``GET`` of the settings, resumes.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.logger import Logger

from cache.collection_settings import stored_indexes
from cache.indexes.builds import IndexBuilds
from cache.settings_cache import FORGET_ALL, SettingsCache

_log = Logger()


def follow_settings_changes(collections: SettingsCache, builds: IndexBuilds) -> None:
    """Resume ``builds``' work for each collection whose settings change."""
    collections.on_change(lambda name: _changed(collections, builds, name))


def _changed(collections: SettingsCache, builds: IndexBuilds, name: Optional[bytes]) -> None:
    if not name or name == FORGET_ALL:
        return  # not one collection's change: the next look at each resumes its own
    reading = collections.store.read(name.decode("utf-8", "replace"))
    reading.addCallback(_resume, builds, name)
    reading.addErrback(
        lambda failure: _log.warn(
            "index work of {name} not resumed: {error}", name=name.decode(), error=failure.getErrorMessage()
        )
    )


def _resume(row: Any, builds: IndexBuilds, name: bytes) -> Any:
    return builds.resume(name, stored_indexes(row[0]) if row is not None else ())
