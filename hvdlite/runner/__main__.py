"""``python -m hvdlite.runner``: the same as the ``hvdlite-run`` command."""

import sys

from hvdlite.runner.cli import main

if __name__ == "__main__":
    sys.exit(main())
