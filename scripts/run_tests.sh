#!/usr/bin/env bash
# Sets up (scripts/setup_env.sh: pip and the build only when their inputs
# changed), lints and runs the test suite. Extra arguments go to pytest, e.g.
# `scripts/run_tests.sh tests/test_ops.py -x`. Selections (tests/README.md):
#   (none)     the default: every test, each sweep through a covering subset
#   --full     every combination of every sweep (-m "not long"; what CI runs)
#   -m long    the multi-seed training runs
# Without a GPU the CUDA tests are deselected (one summary line;
# tests/conftest.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
args=()
for arg in "$@"; do
  if [ "$arg" = --full ]; then args+=(-m "not long"); else args+=("$arg"); fi
done
set -- ${args[@]+"${args[@]}"}
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
echo "[tests] ruff check ."
"$VENV/bin/python" -m ruff check .
echo "[tests] pytest tests $*"
"$VENV/bin/python" -m pytest tests "$@"
