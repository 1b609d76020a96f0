#!/usr/bin/env bash
# Create .venv (once) and install the project with its pinned dependencies and test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import mindspore, sentencepiece, pycld2, wordfreq, pyarrow, pytest, xdist, pydantic, torch, ray, transformers" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[all]'
  touch .venv/.installed
fi
