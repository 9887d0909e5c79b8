#!/usr/bin/env bash
# One call on the GPU machine: build for the H200, run the CUDA-relevant tests
# and the benchmarks, keep every log under $OUT (device tool) or ./gpu_out.
#   scripts/gpu_check.sh [tests|bench|all] [extra pytest args]
set -uo pipefail
MODE="${1:-all}"; shift || true
# Everything goes to $LOGS, packed at the end into $OUT/gpu_results.tar.gz
# (the device tool brings back only a few files).
OUT="${OUT:-$PWD/gpu_out}"; LOGS="$(mktemp -d)/gpu_results"; mkdir -p "$OUT" "$LOGS"
trap 'tar -czf "$LOGS/gpu_results.tar.gz" -C "$(dirname "$LOGS")" gpu_results' EXIT
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
# The GPU image's default CXX (/opt/gcc) links libstdc++ statically into the
# extension, whose uninitialised iostreams then crash in every TORCH_CHECK
# message; the system compiler links it dynamically like torch.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
export PYG_MULTIHEAD_AGG_DATA="${PYG_MULTIHEAD_AGG_DATA:-$PWD/.device/data}"
{ nvidia-smi; python3 -c "import torch, torch_geometric; print('torch', torch.__version__, torch.version.cuda, 'PyG', torch_geometric.__version__)"; git log -1 --format='commit %H %s' 2>/dev/null; } > "$LOGS/env.txt" 2>&1
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -v -e . > "$LOGS/build.log" 2>&1 \
  || { tail -60 "$LOGS/build.log"; exit 1; }
grep -E "registers|spill|stack frame" "$LOGS/build.log" | sort | uniq > "$LOGS/ptxas.txt" || true
echo "build: $(( $(date +%s) - start )) s"
rc=0
if [ "$MODE" = tests ] || [ "$MODE" = all ]; then
  python3 -m pytest tests -q -rs -p no:cacheprovider "$@" > "$LOGS/tests.log" 2>&1 || rc=$?
  tail -25 "$LOGS/tests.log"
fi
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  python3 benchmarks/bench_ops.py --device cuda --out "$LOGS" > "$LOGS/bench_ops.log" 2>&1 || rc=$?
  tail -40 "$LOGS/bench_ops.log"
  python3 benchmarks/bench_layer.py --device cuda --out "$LOGS" > "$LOGS/bench_layer.log" 2>&1 || rc=$?
  tail -30 "$LOGS/bench_layer.log"
fi
exit $rc
