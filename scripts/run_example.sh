#!/usr/bin/env bash
# Sets up (scripts/setup_env.sh: pip and the build only when their inputs
# changed) and trains the 2-layer GAT on Cora.
# Extra arguments go to examples/train_cora.py, e.g. `--runs 10 --adj csr`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
DATA="${DATA:-$HOME/.cache/pyg_multihead_agg/data}"
# Offline machines: seed the data folder from a local copy of the raw files.
if [ ! -d "$DATA/Cora/raw" ] && [ -d "$ROOT/../shared/data/Cora/raw" ]; then
  mkdir -p "$DATA/Cora" && cp -r "$ROOT/../shared/data/Cora/raw" "$DATA/Cora/"
fi
"$VENV/bin/python" "$ROOT/examples/train_cora.py" --root "$DATA" "$@"
