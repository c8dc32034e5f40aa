"""HTTP handlers: one module per resource, on a shared JSON base handler.

The layers, and the rule that keeps them:

- ``handlers/`` itself holds the request handlers (``documents``,
  ``collections``, ``multi_get``, ``batch``, ``changes``, ``tickets``,
  ``collection_settings``, ``health``, ``metrics``, ``docs``, ``openapi``),
  their base (``base``), the direct answers the connection gives for them
  (``direct_*``), and ``idempotency``, whose ``respond_once`` wraps a
  handler's method and maps its failures through ``base``.
- ``handlers/http/``: the HTTP semantics a handler uses, none of them a
  handler: admission (``auth``: tokens, scopes, rates), request checks
  (``validation``), content coding and conditional requests
  (``negotiation``, ``conditional``, ``representation``), ``Cache-Control``
  (``cache_policy``), CORS (``cors``), problem details (``errors``) and
  ``deferreds``.
- ``handlers/feed/``: the change feed's fan-out in a worker (``feed``, its
  per-collection ``hub``, each resuming ``subscriber``, the SSE
  ``event_stream``), which ``changes`` serves.

A module in a subpackage imports ``cache/`` and other subpackages, never a
module of ``handlers/`` itself: what needs a handler or ``base`` is a
handler-level module and lives at the top. Nothing here imports ``api/``.
"""
