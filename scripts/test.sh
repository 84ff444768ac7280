#!/usr/bin/env bash
# The whole test suite on a fresh machine: create the virtual environment (.venv), install
# the project with its test, plot, fast and serve extras (torch pinned to the local CPU wheel;
# numba for the compiled kernels), lint, run pytest on two workers (pytest-xdist, a test file
# at a time, the dearest files first: tests/conftest.py's DEAREST; each worker's threads its
# share of the cores; most of a cold run is compiling kernels, one core each). The tests run
# both kernel backends, NumPy and compiled. Extra arguments go to pytest, e.g.
# scripts/test.sh tests/quant -x, or -n 0 for one process
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
install_project test,plot,fast,serve
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
exec "$VENV/bin/python" -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
