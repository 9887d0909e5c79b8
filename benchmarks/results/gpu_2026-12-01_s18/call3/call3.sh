#!/usr/bin/env bash
# Session 18 call 3: c4 = this tree (c3 + grad_x alone through the
# dot-gather kernels without their dots, rowval and dot_out null). Every
# CUDA test; memcheck; bench_kernels fp32 + bf16 of the baseline (333395d,
# b8 build: the dot-gather kernels as c3) and c4.
set -u
export PYTHONUNBUFFERED=1
cp .device/s18/c4.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" SANITIZE_LIMIT=100 \
 STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=90 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "^== |spmm_(fwd|bwd)" $OUT/run.log | cut -c1-62
