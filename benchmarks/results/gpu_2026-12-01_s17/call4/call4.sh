#!/usr/bin/env bash
# Session 17 call 4 (final): b4 = this tree (the tensor-core spmm backward,
# 2 stages, taken whenever it applies; the forward's copies with the index
# select). Every CUDA test; bench_kernels (fp32, bf16) of the baseline
# (bdc5a16, session 16's last commit, its t6 build) and b4; bench_ops;
# memcheck, racecheck and synccheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s17/b4.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" OPS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" \
 STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=100 STEP_LIMIT_OPS=150 \
 bash scripts/gpu_check.sh tests,kernels,baseline,ops,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm_(fwd|bwd)|^== " $OUT/run.log | cut -c1-62
