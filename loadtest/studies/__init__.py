"""One-off studies: measurements made once to answer a question, kept so they can be run again.

Each module runs as ``python -m loadtest.studies.<name>``; README.md beside
this file lists what each measures, its command and the page that quotes it.
Their names start with ``_`` so that ``locust -f loadtest/`` does not import
them. They use the tooling one level up (``loadtest._servers``, ``_token``,
``_data``, ``_gate``, ``_run``) and write their reports under
``loadtest/results/``. Nothing here is run by ``make`` or by the gate.
"""
