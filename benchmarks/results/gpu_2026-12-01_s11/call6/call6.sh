#!/usr/bin/env bash
# Session 11 call 6: tree = branch s11-stream (the transposed gather's rows
# in runs); baseline = main (64aebba's build). Every CUDA test, memcheck,
# bench_kernels of baseline and tree. One tar back besides gpu_check's files.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c6
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/baseline/pyg_multihead_agg/_C.abi3.so > $W/c6/sos.txt
PREBUILT=1 KERNELS_ARGS="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16" \
 SANITIZE_TOOLS="memcheck" STEP_LIMIT_TESTS=170 STEP_LIMIT_KERNELS=70 STEP_LIMIT_SANITIZE=60 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "^(FAILED|ERROR)" $OUT/tests.log | head -20
grep -E "\| memcheck" $OUT/run.log
tar -cf $OUT/c6.tar -C $W c6
