#!/usr/bin/env bash
# examples/train_ogb.py at ogbn-products' size on one GPU: writes the
# synthetic stand-in (2,449,029 nodes, about 123M directed edges, 100
# features, 47 classes; examples/ogb_synthetic.py), trains the 3-layer GAT
# full-batch with our layers and with PyG's (eager, compiled, bf16; GAT and
# GATv2), mini-batch where a sampler is installed, each run under a time
# limit, and gathers the runs into benchmarks/reference/ogb_cuda.md and .json
# (machine and commit inside). Needs no ogb package, no network.
#
#   scripts/ogb_device.sh STEPS
#
# STEPS, comma-separated (each under about 8 minutes on an H200 once the
# extension is built; a device call lasts at most 10):
#   write          write the graph (skipped when ROOT holds it), report seconds and RAM
#   full-gat       GAT 4 heads x 64, ours and PyG's, eager
#   full-gatv2     GATv2 4 x 64, ours and PyG's, eager
#   full-compile   GAT 4 x 64, ours and PyG's, torch.compile(dynamic=True)
#   full-gatv2-compile  GATv2 4 x 64, ours and PyG's, torch.compile(dynamic=True)
#   full-bf16      GAT 4 x 64, ours and PyG's, --amp bf16
#   full-narrow    GAT 2 x 16, ours and PyG's, eager (PyG's runs out of memory)
#   full-fit       GAT 2 x 8, ours and PyG's, eager and compiled (a width PyG's fits),
#                  trained to its accuracy plateau (FIT_EPOCHS, FIT_LR)
#   minibatch      GAT 4 x 64 over NeighborLoader batches (15,10,5; 1024 seeds),
#                  ours and PyG's; without pyg-lib or torch-sparse it takes
#                  torch-sparse's CPU operators built beforehand for this
#                  machine (SAMPLER_SITE, default .device/sampler_site, from
#                  scripts/build_sampler_device.sh), or builds them here from
#                  a carried source archive (SAMPLER_SDIST, default
#                  .device/sdist/torch_sparse-*.tar.gz: `pip download
#                  --no-deps --no-binary :all: torch-sparse`), else writes a
#                  "no sampler" row
#   minibatch-compile  the same, torch.compile(dynamic=True)
#   summary        benchmarks/reference/ogb_cuda.{md,json} from every result so far
#   all            every step above, in this order (longer than one device call)
# Every call ends with the summary of the results so far, and copies to $OUT:
#   ogb.log (steps and result lines), ogb_results.tar (each run's JSON and
#   log), ogb_cuda.md, ogb_cuda.json.
# Results gather in RESULTS across calls on the same (warm) machine; from a
# fresh one, untar each call's ogb_results.tar into one folder and run
#   python examples/train_ogb.py --summarise FOLDER benchmarks/reference/ogb_cuda
# A run out of GPU memory is a row ("out of memory in training/evaluation"),
# and so is one cut by its time limit or failing otherwise.
#
# Suggested calls (timeout_s 600 each):
#   1. bash scripts/ogb_device.sh write,full-gat,full-gatv2
#   2. bash scripts/ogb_device.sh full-compile,full-bf16,full-narrow
#   3. bash scripts/ogb_device.sh write,full-fit,minibatch
#   4. bash scripts/ogb_device.sh write,full-gatv2-compile,minibatch-compile
#
# The extension: PREBUILT=1 uses a carried pyg_multihead_agg/_C.abi3.so
# (scripts/cross_build_device.sh, carry: ["pyg_multihead_agg/_C.abi3.so"]);
# otherwise it is built here when no CUDA op runs (minutes, first call only
# on a warm machine).
# Env: SAMPLER_BUILD_LIMIT (seconds for that build, default 420; it took 13
# minutes on a 2-core CPU), EPOCHS (full-batch epochs, default 30),
# MB_EPOCHS (mini-batch epochs, default 2), WORKERS (NeighborLoader workers, default 8), NODES (default
# 2449029), FIT_EPOCHS / FIT_LR (full-fit's epochs and learning rate, default
# 100 and 0.01), STEP_LIMIT (seconds per run, default 240), ROOT (the graph's
# folder, default /tmp/pyg_multihead_agg_ogb), RESULTS (default
# .device/ogb_results), SUMMARY (default benchmarks/reference/ogb_cuda), DEVICE
# (default cuda; cpu with a small NODES tries the script anywhere), PYTHON
# (default python3).
set -uo pipefail
STEPS="${1:?usage: scripts/ogb_device.sh STEPS (write,full-gat,...; see the header)}"
[ "$STEPS" = all ] && \
  STEPS=write,full-gat,full-gatv2,full-compile,full-gatv2-compile,full-bf16,full-narrow,full-fit,minibatch,minibatch-compile,summary
has() { [[ ",$STEPS," == *",$1,"* ]]; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"; cd "$REPO"
OUT="${OUT:-$REPO/gpu_out}"; mkdir -p "$OUT"
EPOCHS="${EPOCHS:-30}"; MB_EPOCHS="${MB_EPOCHS:-2}"; WORKERS="${WORKERS:-8}"
FIT_EPOCHS="${FIT_EPOCHS:-100}"; FIT_LR="${FIT_LR:-0.01}"
NODES="${NODES:-2449029}"; LIMIT="${STEP_LIMIT:-240}"; DEVICE="${DEVICE:-cuda}"
ROOT="${ROOT:-/tmp/pyg_multihead_agg_ogb}"
RESULTS="${RESULTS:-$REPO/.device/ogb_results}"; mkdir -p "$RESULTS"
SUMMARY="${SUMMARY:-$REPO/benchmarks/reference/ogb_cuda}"
LOG="$OUT/ogb.log"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }

{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  "$PY" -c "import torch, torch_geometric; print('torch', torch.__version__, 'PyG', torch_geometric.__version__)"
  git log -1 --format='commit %h %s' 2>/dev/null; } >> "$LOG" 2>&1

# The extension with its CUDA kernels (as scripts/sanitize.sh probes it).
if [ "${PREBUILT:-0}" = 1 ]; then
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
probe='import torch, pyg_multihead_agg as p; r = torch.tensor([0, 1], device="cuda"); '\
'p.multihead_spmm(r, r[:1], torch.ones(1, 1, device="cuda"), torch.ones(1, 1, 2, device="cuda"))'
if [ "$DEVICE" = cuda ] && ! "$PY" -c "$probe" > /dev/null 2>&1; then
  say "building the extension"
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi  # as gpu_check.sh
  MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
    "$PY" -m pip install --no-build-isolation --no-deps -e . > "$OUT/ogb_build.log" 2>&1 \
    || { tail -30 "$OUT/ogb_build.log" | tee -a "$LOG"; exit 1; }
fi

GRAPH=(--dataset ogbn-products --synthetic "$NODES" --root "$ROOT" --device "$DEVICE")
# One run: NAME then train_ogb.py's arguments; its JSON (or, when it wrote
# none, a row saying why) goes to RESULTS.
row() {
  local name="$1"; shift
  say "$name: $*"
  rm -f "$RESULTS/$name.json"
  timeout "$LIMIT" "$PY" examples/train_ogb.py "${GRAPH[@]}" --json "$RESULTS/$name.json" \
    "$@" > "$RESULTS/$name.log" 2>&1
  local rc=$?
  if [ ! -s "$RESULTS/$name.json" ]; then
    local why="failed (exit $rc): $(grep -v '^\s*$' "$RESULTS/$name.log" | tail -1 | cut -c1-200)"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then why="timed out after $LIMIT s"; fi
    "$PY" -c 'import json, sys; json.dump({"status": sys.argv[1], "args": sys.argv[3:]},
                open(sys.argv[2], "w"))' "$why" "$RESULTS/$name.json" "$@" 2>> "$LOG"
  fi
  tail -2 "$RESULTS/$name.log" | tee -a "$LOG"
}
full() {  # NAME LAYER [args]: the full-batch model
  local name="$1" layer="$2"; shift 2
  row "$name" --layer "$layer" --epochs "$EPOCHS" --log-every 5 "$@"
}

if has write; then
  say write
  row 00_write --write-only
fi
if has full-gat; then
  full 10_gat_ours ours --conv gat
  full 11_gat_pyg pyg --conv gat
fi
if has full-gatv2; then
  full 20_gatv2_ours ours --conv gatv2
  full 21_gatv2_pyg pyg --conv gatv2
fi
if has full-compile; then
  full 30_gat_ours_compile ours --conv gat --compile
  full 31_gat_pyg_compile pyg --conv gat --compile
fi
if has full-gatv2-compile; then
  full 32_gatv2_ours_compile ours --conv gatv2 --compile
  full 33_gatv2_pyg_compile pyg --conv gatv2 --compile
fi
if has full-bf16; then
  full 40_gat_ours_bf16 ours --conv gat --amp bf16
  full 41_gat_pyg_bf16 pyg --conv gat --amp bf16
fi
if has full-narrow; then
  full 50_gat_ours_2x16 ours --conv gat --heads 2 --hidden 16
  full 51_gat_pyg_2x16 pyg --conv gat --heads 2 --hidden 16
fi
if has full-fit; then  # trained to its plateau: FIT_EPOCHS epochs at learning rate FIT_LR
  fit() {  # NAME LAYER [args]
    local name="$1" layer="$2"; shift 2
    row "$name" --layer "$layer" --conv gat --heads 2 --hidden 8 --epochs "$FIT_EPOCHS" \
      --lr "$FIT_LR" --eval-every 10 --log-every 10 "$@"
  }
  fit 70_gat_ours_2x8 ours
  fit 71_gat_pyg_2x8 pyg
  fit 72_gat_ours_2x8_compile ours --compile
  fit 73_gat_pyg_2x8_compile pyg --compile
fi
if has minibatch || has minibatch-compile; then
  sampler='from torch_geometric.typing import WITH_PYG_LIB as a, WITH_TORCH_SPARSE as b; exit(0 if a or b else 1)'
  # Without a sampler: torch-sparse's CPU operators (NeighborLoader samples
  # on the CPU) built beforehand, else built from a carried source archive.
  site="${SAMPLER_SITE:-.device/sampler_site}"
  if ! "$PY" -c "$sampler" 2> /dev/null && [ -d "$site/torch_sparse" ]; then
    export PYTHONPATH="$(cd "$site" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
    say "minibatch: torch-sparse from $site"
  fi
  sdist=$(ls ${SAMPLER_SDIST:-.device/sdist/torch_sparse-*.tar.gz} 2>/dev/null | head -1)
  if ! "$PY" -c "$sampler" 2> /dev/null && [ -n "$sdist" ]; then
    say "minibatch: building torch-sparse (CPU) from $sdist"
    FORCE_ONLY_CPU=1 MAX_JOBS="${MAX_JOBS:-16}" timeout "${SAMPLER_BUILD_LIMIT:-420}" \
      "$PY" -m pip install -q --no-build-isolation --no-deps --target /tmp/sampler_site "$sdist" \
      > "$OUT/sampler_build.log" 2>&1 && export PYTHONPATH="/tmp/sampler_site${PYTHONPATH:+:$PYTHONPATH}"
    tail -2 "$OUT/sampler_build.log" >> "$LOG"
  fi
  if "$PY" -c "$sampler" 2> /dev/null; then
    # Evaluation (full graph) after the last epoch only: the rows time the batches.
    mb=(--fanout 15,10,5 --batch-size 1024 --num-workers "$WORKERS" --epochs "$MB_EPOCHS"
        --eval-every 0 --log-every 1)
    for layer in ours pyg; do
      has minibatch && row "60_minibatch_$layer" --layer "$layer" "${mb[@]}"
      has minibatch-compile && row "61_minibatch_${layer}_compile" --layer "$layer" "${mb[@]}" \
        --compile
    done
  else
    say "minibatch: no sampler (PyG's NeighborLoader needs pyg-lib or torch-sparse)"
    echo '{"row": "60_minibatch", "mode": "mini-batch 15,10, batch 1024", "status": "not run: no sampler (pyg-lib or torch-sparse) installed"}' \
      > "$RESULTS/60_minibatch.json"
  fi
fi

# The summary of every result so far, and the files back.
"$PY" examples/train_ogb.py --summarise "$RESULTS" "$SUMMARY" >> "$LOG" 2>&1
cp "$SUMMARY.md" "$SUMMARY.json" "$OUT/" 2>/dev/null
tar -cf "$OUT/ogb_results.tar" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
