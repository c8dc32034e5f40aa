"""Consistency checking: recorded histories of concurrent clients checked by Porcupine (issue #56).

``python -m tests.consistency.run --scenario NAME`` (or ``make test-consistency``);
see ``tests/consistency/README.md``.
"""
