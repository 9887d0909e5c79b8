#!/usr/bin/env bash
# Sets up a virtual environment with everything the package, its tests and
# its examples need, and builds the extension into it. Sourced by
# run_tests.sh and run_example.sh; safe to run again (pip skips what is there).
#
#   VENV=path          the environment (default: .venv in the repository)
#   TORCH_SPEC=spec    which torch (default torch==2.13.0; for a CUDA build on
#                      a GPU machine use e.g. "torch" or a CUDA index URL)
#   WHEELS=dir         prebuilt torch-scatter / torch-sparse wheels
#                      (default: ../shared/wheels if it exists)
#   WITH_TORCH_SPARSE=0|1  install torch-sparse (default 1 when WHEELS exists;
#                      without wheels pip builds it from source, ~20 min)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
WHEELS="${WHEELS:-$ROOT/../shared/wheels}"
if [ -d "$WHEELS" ]; then WITH_TORCH_SPARSE="${WITH_TORCH_SPARSE:-1}"; else WITH_TORCH_SPARSE="${WITH_TORCH_SPARSE:-0}"; fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

pip_install --upgrade pip setuptools wheel
pip_install "$TORCH_SPEC"
pip_install ninja torch-geometric pytest hypothesis ruff tqdm matplotlib
if [ "$WITH_TORCH_SPARSE" = "1" ]; then
  if [ -d "$WHEELS" ]; then
    pip_install --find-links "$WHEELS" torch-scatter torch-sparse
  else
    pip_install --no-build-isolation torch-scatter torch-sparse
  fi
fi
# The extension is built against the torch installed above.
MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" -m pip install --disable-pip-version-check -q \
  --no-build-isolation -e "$ROOT"
"$PY" -c "import torch, torch_geometric, pyg_multihead_agg as p; \
print('torch', torch.__version__, '| PyG', torch_geometric.__version__, '| pyg_multihead_agg', p.__version__)"
