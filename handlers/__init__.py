"""HTTP handlers: one module per resource, on a shared JSON base handler.

The layers, and the rule that keeps them:

- ``handlers/`` itself holds the request handlers (``documents``,
  ``collections``, ``multi_get``, ``batch``, ``changes``, ``tickets``,
  ``collection_settings``, ``health``, ``metrics``, ``docs``), their base
  (``base``), the operation table they are routed from, and
  ``idempotency``, whose ``respond_once`` wraps a handler's method and maps
  its failures through ``base``.
- ``handlers/openapi/``: ``/openapi.json``, generated from the operation
  table; being about the handlers, it may import them.
- ``handlers/http/``: the HTTP semantics a handler uses, none of them a
  handler: admission (``auth``: tokens, scopes, rates), request checks
  (``validation``), content coding and conditional requests
  (``negotiation``, ``conditional``, ``representation``), ``Cache-Control``
  (``cache_policy``), CORS (``cors``), problem details (``errors``) and
  ``deferreds``.
- ``handlers/feed/``: the change feed's fan-out in a worker (``feed``, its
  per-collection ``hub``, each resuming ``subscriber``, the SSE
  ``event_stream``), which ``changes`` serves.

A module of ``handlers/http/`` or ``handlers/feed/`` imports ``cache/`` and
these two, never a module of ``handlers/`` itself: what needs a handler or
``base`` is handler-level and lives at the top. Nothing here imports
``api/`` (``tests/test_tree.py`` checks both).
"""
