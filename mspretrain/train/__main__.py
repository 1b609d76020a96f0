"""`python -m mspretrain.train ...` is the `train` console script."""
import sys

from mspretrain.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
