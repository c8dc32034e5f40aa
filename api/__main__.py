"""``python -m api``: Jetway's command line (``api.cli``) on Jetway's reactor.

The reactor (``api.event_loop``) is installed before the command line is
imported, because txredisapi takes the global reactor when it is imported.
``serve`` (the master) first execs itself on ``JETWAY_MASTER_PYTHON`` when
that names another interpreter (``api.master_python``), or else, on PyPy,
with its own GC settings, before any import fills the nursery
(``api.master_gc``).
"""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        from api.master_gc import exec_with_master_gc
        from api.master_python import exec_on_master_python

        exec_on_master_python(sys.argv[1:])
        exec_with_master_gc(sys.argv[1:])
    from api import event_loop

    event_loop.install()
    from api.cli import main

    sys.exit(main())
