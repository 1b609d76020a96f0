#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"   # msrun starts workers with the python on PATH
# Two test processes (PYTEST_WORKERS=0 for one): each test file runs whole in one of them, so its
# module fixtures (a built dataset, a trained run) are made once.
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
