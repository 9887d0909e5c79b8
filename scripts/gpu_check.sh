#!/usr/bin/env bash
# One call on the GPU machine: build for the H200, run the CUDA tests, the
# benchmarks and the Cora example, with a time limit per step. Logs go
# straight to $OUT (device tool; ./gpu_out elsewhere) so that a call cut short
# still returns what finished:
#   $OUT/tests.log  $OUT/run.log  $OUT/results.tar (probe outputs, logs)
#   $OUT/reference.tar (the benchmark files this call wrote, as one file:
#                    the device tool returns at most 8; untar it into
#                    benchmarks/reference/ when the run was on another machine)
#   scripts/gpu_check.sh STEPS [pytest args; default: tests -m "cuda and not slow",
#                               every CUDA kernel path (tests/README.md);
#                               tests -m "cuda and not long": every combination,
#                               when a kernel changes]
# STEPS: a comma-separated list of tests, props (the property tests with the
# larger "gpu" hypothesis profile), kernels (tools/bench_kernels.py), baseline
# (with kernels: also time the tree in .device/baseline, see below), ncu
# (Nsight Compute over tools/bench_kernels.py --ncu), ops, cora, layer,
# minibatch (if benchmarks/bench_minibatch.py exists), profile
# (tools/profile_layer.py), compile (tools/profile_step.py --steps compile:
# each family's step on COMPILE_SHAPES, default arxiv-like, eager and
# compiled, host against wall time), sanitize, or "bench" (= ops,cora,layer,minibatch:
# regenerates benchmarks/reference/) or "all" (= tests and bench).
# cora and minibatch read what scripts/prepare_device.sh puts in .device/ on
# the CPU machine (the Cora files, NeighborLoader's sampler): carry it.
#   (env: STEP_LIMIT_* seconds per step, OPS_ARGS / LAYER_ARGS / MINIBATCH_ARGS,
#    LAYER_CONVS, COMPILE_SHAPES / COMPILE_CONVS,
#    BENCH_OUT (default benchmarks/reference), CORA_RUNS, SANITIZE_TOOLS)
set -uo pipefail
MODE="${1:-all}"; shift || true
case "$MODE" in
  all) MODE=tests,ops,cora,layer,minibatch;;
  bench) MODE=ops,cora,layer,minibatch;;
esac
has() { [[ ",$MODE," == *",$1,"* ]]; }
if [ $# -eq 0 ]; then set -- tests -m "cuda and not slow"; fi
OUT="${OUT:-$PWD/gpu_out}"; RES="$(mktemp -d)/results"; mkdir -p "$OUT" "$RES"
# (relative: the benchmark files record their command line)
BENCH_OUT="${BENCH_OUT:-benchmarks/reference}"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
# The GPU image's default CXX (/opt/gcc) links libstdc++ statically into the
# extension, whose uninitialised iostreams then crash in every TORCH_CHECK
# message; the system compiler links it dynamically like torch.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
export PYG_MULTIHEAD_AGG_DATA="${PYG_MULTIHEAD_AGG_DATA:-$PWD/.device/data}"
LOG="$OUT/run.log"
pack() { tar -cf "$OUT/results.tar" -C "$(dirname "$RES")" results 2>/dev/null || true; }
# The benchmark files this call wrote (newer than .start), as one tar file that
# comes back by itself.
touch "$RES/.start"
pack_reference() {
  local files
  files=$(cd "$BENCH_OUT" && find . -maxdepth 1 -name '*_cuda*.*' -newer "$RES/.start" | sort)
  [ -n "$files" ] && (cd "$BENCH_OUT" && tar -cf "$OUT/reference.tar" $files) || true
}
step() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, torch_geometric; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'PyG', torch_geometric.__version__)"
  git log -1 --format='commit %H %s' 2>/dev/null; } >> "$LOG" 2>&1
# "baseline": an older tree copied (git archive) to .device/baseline is built
# in place alongside, and the kernels step times it first, in its own process
# (both register the same operator names), for an A/B in the same call.
# PREBUILT=1: use the carried pyg_multihead_agg/_C.abi3.so (and the baseline's,
# if carried) from scripts/cross_build_device.sh instead of building here;
# a carried PREBUILT_XZ (default .device/prebuilt/_C.abi3.so.xz) is unpacked
# into its place first, and the baseline's pyg_multihead_agg/_C.abi3.so.xz
# into the baseline's (the .so is over the carry limit, its xz is not).
BASE="$PWD/.device/baseline"
unpack_so() {
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$1" "$2" && chmod +x "$2"
}
if [ "${PREBUILT:-0}" = 1 ]; then
  packed="${PREBUILT_XZ:-.device/prebuilt/_C.abi3.so.xz}"
  [ -f "$packed" ] && unpack_so "$packed" pyg_multihead_agg/_C.abi3.so
  [ -f "$BASE/pyg_multihead_agg/_C.abi3.so.xz" ] &&
    unpack_so "$BASE/pyg_multihead_agg/_C.abi3.so.xz" "$BASE/pyg_multihead_agg/_C.abi3.so"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  ls -la pyg_multihead_agg/_C*.so "$BASE"/pyg_multihead_agg/_C*.so >> "$LOG" 2>&1
fi
if has baseline && [ -f "$BASE/setup.py" ] && ! ls "$BASE"/pyg_multihead_agg/_C*.so > /dev/null 2>&1; then
  (cd "$BASE" && python3 setup.py build_ext --inplace > "$RES/build_baseline.log" 2>&1) &
  BASE_PID=$!
fi
if [ "${PREBUILT:-0}" != 1 ]; then
  step build
  python3 -m pip install --no-build-isolation --no-deps -v -e . > "$RES/build.log" 2>&1 \
    || { tail -60 "$RES/build.log" | tee -a "$LOG"; pack; exit 1; }
fi
if [ -n "${BASE_PID:-}" ]; then
  wait "$BASE_PID" || { echo "baseline build failed" | tee -a "$LOG"; tail -30 "$RES/build_baseline.log" >> "$LOG"; }
fi
grep -E "registers|spill" "$RES/build.log" | sort | uniq -c | sort -rn | head -5 >> "$LOG"
rc=0
if has tests; then
  step tests
  # (One process: 4 pytest-xdist workers were slower on the H200.)
  timeout "${STEP_LIMIT_TESTS:-240}" python3 -m pytest "$@" \
    -q -rs -p no:cacheprovider --timeout 120 --junitxml "$RES/tests.xml" \
    > "$OUT/tests.log" 2>&1 || rc=$?
  tail -15 "$OUT/tests.log" | tee -a "$LOG"
  pack
fi
if has props; then
  step props
  HYPOTHESIS_PROFILE=gpu timeout "${STEP_LIMIT_PROPS:-240}" python3 -m pytest \
    tests/test_properties.py -k cuda -q -p no:cacheprovider > "$RES/props_gpu_profile.log" 2>&1 \
    || rc=$?
  tail -3 "$RES/props_gpu_profile.log" | tee -a "$LOG"
  pack
fi
if has kernels; then
  if has baseline && ls "$BASE"/pyg_multihead_agg/_C*.so > /dev/null 2>&1; then
    step bench_kernels baseline
    # An older tree may still hold the script at its former place.
    BASE_KERNELS=tools/bench_kernels.py
    [ -f "$BASE/$BASE_KERNELS" ] || BASE_KERNELS=benchmarks/bench_kernels.py
    (cd "$BASE" && PYTHONPATH="$BASE" python3 -c \
       "import pyg_multihead_agg as m; print('baseline package', m.__file__)" \
     && PYTHONPATH="$BASE" timeout "${STEP_LIMIT_KERNELS:-150}" python3 \
       "$BASE_KERNELS" --out "$RES/baseline" ${KERNELS_ARGS:-}) >> "$LOG" 2>&1 || rc=$?
  fi
  step bench_kernels
  timeout "${STEP_LIMIT_KERNELS:-150}" python3 tools/bench_kernels.py --out "$RES" \
    ${KERNELS_ARGS:-} >> "$LOG" 2>&1 || rc=$?
  if [ -n "${KERNELS64_ARGS:-}" ]; then
    step bench_kernels "$KERNELS64_ARGS"
    timeout "${STEP_LIMIT_KERNELS:-150}" python3 tools/bench_kernels.py --out "$RES/second" \
      $KERNELS64_ARGS >> "$LOG" 2>&1 || rc=$?
  fi
  pack
fi
if has ncu; then
  step ncu
  NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
  timeout "${STEP_LIMIT_NCU:-200}" "$NCU" --clock-control none --profile-from-start off \
    --kernel-name "regex:${NCU_KERNELS:-gather_kernel|gat_|attention_}" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    --metrics sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min \
    python3 tools/bench_kernels.py --ncu ${NCU_ARGS:---shapes products-like} \
    > "$RES/ncu.log" 2>&1 || rc=$?
  tail -5 "$RES/ncu.log" >> "$LOG"
  pack
fi
if has ops; then
  step bench_ops
  timeout "${STEP_LIMIT_OPS:-150}" python3 benchmarks/bench_ops.py --device cuda \
    --out "$BENCH_OUT" ${OPS_ARGS:-} >> "$LOG" 2>&1 || rc=$?
  pack_reference
fi
if has cora; then
  step cora
  DATA=$(mktemp -d); cp -r "$PYG_MULTIHEAD_AGG_DATA/Cora" "$DATA/"
  timeout "${STEP_LIMIT_CORA_BENCH:-240}" python3 benchmarks/bench_cora_epoch.py --device cuda \
    --root "$DATA" --rounds 20 --out "$BENCH_OUT" >> "$LOG" 2>&1 || rc=$?
  pack_reference
  for adj in ${CORA_ADJS:-}; do
    timeout "${STEP_LIMIT_CORA:-60}" python3 examples/train_cora.py --device cuda --adj $adj \
      --runs "${CORA_RUNS:-10}" --quiet --root "$DATA" --json "$RES/cora_cuda_$adj.json" \
      >> "$LOG" 2>&1 || rc=$?
  done
  pack
fi
# The rows of benchmarks/reference/layer{,_gatv2,_transformer}_cuda.md, as
# those files' commands wrote them (the three graphs, float32 forward +
# backward; the transformer's with bf16 autocast too).
layer_reference() {
  local pyg='PyG edge_index (eager|compiled)$' extra=()
  local ours='ours (edge_index|EdgeIndex) (eager|compiled)(, reduce-overhead)?$'
  case "$1" in
    gatv2) pyg='PyG edge_index compiled$';;
    transformer) extra=(--autocast bfloat16);;
  esac
  python3 benchmarks/bench_layer.py --device cuda --conv "$1" \
    --shapes arxiv-like,products-like,reddit-like --dtypes float32 ${extra[@]+"${extra[@]}"} \
    --passes forward+backward --reduce-overhead \
    --methods "$pyg|$ours|new graph every call|compiled, prepared\$" --out "$BENCH_OUT"
}
if has layer; then
  # LAYER_ARGS: bench_layer.py's own arguments instead (its default rows);
  # else the reference rows of each layer in LAYER_CONVS (default gat: 136,
  # 240 and 294 s for gat, gatv2 and transformer on the H200).
  if [ -n "${LAYER_ARGS:-}" ]; then
    step bench_layer "$LAYER_ARGS"
    timeout "${STEP_LIMIT_LAYER:-300}" python3 benchmarks/bench_layer.py --device cuda \
      --out "$BENCH_OUT" $LAYER_ARGS >> "$LOG" 2>&1 || rc=$?
  else
    for conv in ${LAYER_CONVS:-gat}; do
      step bench_layer reference "$conv"
      export -f layer_reference
      BENCH_OUT="$BENCH_OUT" timeout "${STEP_LIMIT_LAYER:-330}" bash -c 'layer_reference "$1"' _ \
        "$conv" >> "$LOG" 2>&1 || rc=$?
    done
  fi
  pack_reference
fi
if has minibatch && [ -f benchmarks/bench_minibatch.py ]; then
  step bench_minibatch
  # NeighborLoader's sampler: torch-sparse's CPU operators built for this
  # machine beforehand (scripts/prepare_device.sh), where carried.
  site="${SAMPLER_SITE:-.device/sampler_site}"
  [ -d "$site/torch_sparse" ] && export PYTHONPATH="$(cd "$site" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
  timeout "${STEP_LIMIT_MINIBATCH:-250}" python3 benchmarks/bench_minibatch.py --device cuda \
    --out "$BENCH_OUT" ${MINIBATCH_ARGS:-} >> "$LOG" 2>&1 || rc=$?
  pack_reference
fi
if has profile; then
  step profile_layer
  timeout "${STEP_LIMIT_PROFILE:-120}" python3 tools/profile_layer.py --device cuda \
    > "$RES/profile_layer.md" 2>&1 || rc=$?
  pack
fi
if has compile; then
  step profile_step compile
  for shape in ${COMPILE_SHAPES:-arxiv-like}; do
    for conv in ${COMPILE_CONVS:-gat gatv2 transformer}; do
      timeout "${STEP_LIMIT_COMPILE:-200}" python3 tools/profile_step.py --steps compile \
        --shape "$shape" --conv "$conv" --compile-profile --cprofile --top 15 \
        >> "$RES/compile_steps.md" 2>&1 || rc=$?
    done
  done
  cp "$RES/compile_steps.md" "$OUT/" 2>/dev/null || true
  pack
fi
if has sanitize; then
  step sanitize
  SANITIZE_BUILD=0 bash scripts/sanitize.sh "$RES/sanitize_summary.md" ${SANITIZE_TOOLS:-} \
    >> "$LOG" 2>&1 || rc=$?
  pack
fi
exit $rc
