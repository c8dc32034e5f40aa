"""``python -m api``: Jetway's command line (``api.cli``) on Jetway's reactor.

The reactor (``api.event_loop``) is installed before the command line is
imported, because txredisapi takes the global reactor when it is imported.
"""

import sys

from api import event_loop

if __name__ == "__main__":
    event_loop.install()
    from api.cli import main

    sys.exit(main())
