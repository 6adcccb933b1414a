"""`python -m sqlenv …` — see `sqlenv/cli.py`."""

import sys

from sqlenv.cli import main

if __name__ == "__main__":
    sys.exit(main())
