#!/usr/bin/env bash
# Session 18 call 2: c3 = this tree (grad_x-only tensor-core backward at 2
# blocks an SM, taken whenever it applies; the compiled layer's perm_inv).
# Every CUDA test; memcheck, racecheck, synccheck; bench_kernels fp32 + bf16;
# the layer (products-, reddit-like, fp32): PyG compiled and ours eager and
# compiled, then the baseline's (333395d) compiled layer.
set -u
export PYTHONUNBUFFERED=1
cp .device/s18/c3.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_LIMIT=100 \
 STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=90 \
 bash scripts/gpu_check.sh tests,kernels,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
M="PyG edge_index compiled|EdgeIndex eager|EdgeIndex compiled"
timeout 110 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer.log 2>&1; echo "layer rc $?"
(cd .device/baseline && PYTHONPATH=$PWD timeout 60 python3 benchmarks/bench_layer.py --device cuda \
  --out $OUT/layer_baseline --shapes products-like,reddit-like --dtypes float32 \
  --methods "EdgeIndex compiled" > $OUT/layer_baseline.log 2>&1; echo "baseline rc $?")
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "spmm_(fwd|bwd)" $OUT/run.log | cut -c1-62
grep -E "^\| (products|reddit)" $OUT/layer/*.md $OUT/layer_baseline/*.md | cut -d'|' -f2-8
