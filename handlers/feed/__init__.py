"""The change feed's fan-out in one worker: a hub per followed collection, its subscribers, their SSE streams.

``handlers.changes`` serves ``GET /v1/_changes/{coll}`` from it; the feed's
storage and positions are ``cache.feed.streams`` and ``cache.feed.position``.
"""
