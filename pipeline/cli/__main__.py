"""`python -m pipeline.cli ...`: the same as the `mixflow` script (the local job starts its roles this way)."""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
