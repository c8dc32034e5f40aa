"""Load testing Jetway: locust users, the recorded baseline and the gate, the wrk bench.

``locust -f loadtest/`` imports every ``.py`` file under this folder whose
name does not start with ``_`` (sub-folders included), so only the
locustfiles have plain names; everything else is tooling whose module names
start with ``_``:

- ``readers.py``, ``writers.py``, ``listers.py``, ``batchers.py``: the locust
  users; ``_jetway``: what they share (the scenario's options, the token, the
  seed).
- ``_data``: the test documents, made deterministically from their id.
- ``_token``: the bearer token, from ``JETWAY_TOKEN`` or the admin CLI.
- ``_servers``: private redis-server, Jetway and nginx processes, by pid.
- ``_baseline``: the figures of a locust run, the baseline and the check.
- ``_run``: ``make loadtest``, ``loadtest-check`` and ``loadtest-record``.
- ``_gate``: the check, this tree against the baseline commit side by side;
  ``_busy`` (with ``busy.lua``): its busy phase under wrk.
- ``baseline.json``: the recorded baseline; ``gate_runs.sh``: the gate run
  many times, to see its noise.
- ``_bench_validators``: the JSON Schema validators compared, and the
  bench's schema and document.
- ``bench/``: ``make bench``, the side-by-side wrk bench and its report.
- ``ab_cpu.sh``: worker CPU per request, two revisions in interleaved pairs.
- ``_jwt_issuer``: a local OpenID Connect issuer and its tokens, for ``ab_cpu.sh``
  (``AUTH_*=jwt``) and the studies.
- ``studies/``: the one-off studies, each with its command, in its README.

Nothing here is imported by the app, and the modules run by the tests
(``_data``, ``_baseline``) use only the standard library, so they run on
PyPy as well as in the CPython environment locust needs (``.venv-loadtest``).
"""
