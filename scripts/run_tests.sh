#!/usr/bin/env bash
# Sets up (scripts/setup_env.sh) and runs the test suite. Extra arguments go to
# pytest, e.g. `scripts/run_tests.sh -m "not slow"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$VENV/bin/python" -m ruff check .
"$VENV/bin/python" -m pytest tests "$@"
