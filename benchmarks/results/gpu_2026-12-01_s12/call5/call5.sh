#!/usr/bin/env bash
# Session 12 call 5: the final tree after review (the gather's launch of its
# transposed instances through one lambda; host code only). Every CUDA test,
# bench_kernels on arxiv-like as a check of the launch choice.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c5
md5sum $R/pyg_multihead_agg/_C.abi3.so > $W/c5/sos.txt
PREBUILT=1 KERNELS_ARGS="--shapes arxiv-like --dtypes float32,bfloat16" STEP_LIMIT_TESTS=210 \
 STEP_LIMIT_KERNELS=60 bash scripts/gpu_check.sh tests,kernels tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
tar -cf $OUT/c5.tar -C $W c5
