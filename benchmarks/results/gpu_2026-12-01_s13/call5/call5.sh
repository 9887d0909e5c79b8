#!/usr/bin/env bash
# Session 13 call 5: the fused backward with perm_inv (p1 = this tree's csrc,
# cross-built). baseline = main 10028d3 (session 12's vF build). Every CUDA
# test; bench_kernels of baseline and tree (gat_bwd and gat_bwd_inv);
# memcheck + racecheck + synccheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s13/p1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_LIMIT=90 \
 STEP_LIMIT_TESTS=230 STEP_LIMIT_KERNELS=90 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "gat_bwd" $OUT/run.log | cut -c1-80
