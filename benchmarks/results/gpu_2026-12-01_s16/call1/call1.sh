#!/usr/bin/env bash
# Session 16 call 1: t1 = the tensor-core forward, first build. TC tests
# first (fail fast), then every CUDA test, bench_kernels baseline (HEAD
# 5984f64 = s15 f5) and t1, bf16 forced through the tensor cores on all
# three shapes, memcheck and racecheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s16/t1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
export PYTHONPATH=$PWD
timeout 120 python3 -m pytest tests/test_cuda_kernels.py -k "tensor_core or tuning_flags" -q -x \
  -p no:cacheprovider > $OUT/tc_tests.log 2>&1
echo "tc tests rc=$?"; tail -30 $OUT/tc_tests.log
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck" STEP_LIMIT_TESTS=200 \
 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
PYG_MULTIHEAD_AGG_TENSOR_CORES=1 timeout 80 python3 benchmarks/bench_kernels.py \
  --shapes arxiv-like,products-like,reddit-like --dtypes bfloat16 --out $OUT/tc_forced > $OUT/tc_forced.log 2>&1
echo "forced rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm|^== " $OUT/run.log | grep -v "rel err" | cut -c1-70
grep -E "^(arxiv|products|reddit)-like .* spmm" $OUT/tc_forced.log | grep -v "rel err" | cut -c1-70
