"""`python -m dataprep ...`: the same as the `dataprep` console script."""
import sys

from dataprep.cli import main

if __name__ == "__main__":
    sys.exit(main())
