"""The HTTP semantics a handler uses: admission, request checks, content coding, conditions, caching, CORS, problems.

No module here is a handler or imports one (``handlers/__init__.py`` says
the rule); each is also what the direct answers use, so a request gets the
same checks whichever path answers it.
"""
