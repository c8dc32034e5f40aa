"""``make bench``: Jetway side by side with its alternatives, under wrk.

``python -m loadtest.bench --help`` lists the options. Module names start
with ``_`` so that ``locust -f loadtest/`` does not import them.
"""
