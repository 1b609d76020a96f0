"""`python -m mspretrain.dataprep ...`: the same as the `dataprep` console script. The import is inside the
guard: spawned worker processes import this module again (as __mp_main__), and need none of the
command line's modules."""
import sys

if __name__ == "__main__":
    from mspretrain.dataprep.cli import main
    sys.exit(main())
