"""``python -m loadtest.bench``: see ``loadtest.bench._bench``."""

import sys

from loadtest.bench._bench import main

sys.exit(main())
