"""`python -m train ...` is the `train` console script."""
import sys

from train.cli import main

sys.exit(main())
