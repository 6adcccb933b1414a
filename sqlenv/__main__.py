"""`python -m sqlenv …` — see `sqlenv/cli/` (one module per subcommand)."""

import sys

from sqlenv.cli import main

if __name__ == "__main__":
    sys.exit(main())
