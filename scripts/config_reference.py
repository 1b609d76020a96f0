"""Write docs/config-reference.md from the config dataclasses (`--check`: fail if it is stale)."""
import argparse
import sys
from pathlib import Path

from mspretrain.common.configref import render
from mspretrain.dataprep.config import BuildConfig
from mspretrain.train.config import Config

DOC = Path(__file__).resolve().parents[1] / "docs" / "config-reference.md"
HEADER = """# Config reference

Every key of the two config trees, generated from the dataclasses that define them
(`python scripts/config_reference.py`; the test suite fails when this page is stale). Set a key in the
YAML file given to `--config`, or on the command line with `--set key=value` (the same syntax in both
tools); an unknown key or a value of the wrong type is an error naming the key (exit code 2).
"""


def generate() -> str:
    return "\n".join([
        HEADER,
        render(BuildConfig, "dataprep build", "`dataprep build CORPUS --out DIR --config FILE --set key=value`; "
               "the shipped example is `configs/dataprep-demo.yaml`."),
        render(Config, "train", "`train launch | eval | doctor | ... --config FILE --set key=value`; the shipped "
               "configs are `configs/tiny.yaml` (CPU) and `configs/llama-{1b,7b,13b}.yaml` (Ascend)."),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config-reference.md is stale")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if not DOC.exists() or DOC.read_text(encoding="utf-8") != text:
            print(f"{DOC} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
