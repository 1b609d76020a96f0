"""`python -m mspretrain.dataprep ...`: the same as the `dataprep` console script. The import is inside the
guard: spawned worker processes import this module again (as __mp_main__), and need none of the
command line's modules. A Ctrl-C while the command's modules import ends it with one line, as later."""
import sys

if __name__ == "__main__":
    try:
        from mspretrain.dataprep.cli import main
    except KeyboardInterrupt:
        print("\ndataprep: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
