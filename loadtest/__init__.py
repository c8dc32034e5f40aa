"""Load testing Jetway: locust users, the recorded baseline and the wrk bench.

``locust -f loadtest/`` imports every ``.py`` file under this folder whose
name does not start with ``_``, so only the locustfiles (``readers.py``,
``writers.py``, ``listers.py``) have plain names; everything else here is
tooling whose module names start with ``_``:

- ``_data``: the test documents, made deterministically from their id.
- ``_token``: the bearer token, from ``JETWAY_TOKEN`` or the admin CLI.
- ``_servers``: private redis-server, Jetway and nginx processes, by pid.
- ``_baseline``: the figures of a locust run, the baseline and the check.
- ``_run``: ``make loadtest``, ``loadtest-check`` and ``loadtest-record``.
- ``bench/``: ``make bench``, the side-by-side wrk bench and its report.

Nothing here is imported by the app, and the modules run by the tests
(``_data``, ``_baseline``) use only the standard library, so they run on
PyPy as well as in the CPython environment locust needs (``.venv-loadtest``).
"""
