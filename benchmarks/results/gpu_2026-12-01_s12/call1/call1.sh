#!/usr/bin/env bash
# Session 12 call 1: tree = sorted fetch (FetchOrder, PYG_MULTIHEAD_AGG_SORT_FETCH);
# baseline = main 5d87d79 (cross-built). Every CUDA test, bench_kernels (with
# its float64 checks, first GPU run) of baseline, tree, tree with the sort off,
# tree bf16 with the split off; memcheck + synccheck. One tar back.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c1
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/baseline/pyg_multihead_agg/_C.abi3.so > $W/c1/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck synccheck" SANITIZE_LIMIT=90 \
 STEP_LIMIT_TESTS=210 STEP_LIMIT_KERNELS=90 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
PYG_MULTIHEAD_AGG_SORT_FETCH=0 PYTHONPATH=$R timeout 90 python3 benchmarks/bench_kernels.py $KA \
  --out $W/c1/nosort > $W/c1/nosort.log 2>&1; echo "nosort rc=$?"
PYG_MULTIHEAD_AGG_SPLIT_ROWS=0 PYTHONPATH=$R timeout 60 python3 benchmarks/bench_kernels.py \
  --shapes products-like,reddit-like --dtypes bfloat16 --out $W/c1/nosplit > $W/c1/nosplit.log 2>&1
echo "nosplit rc=$?"
PYTHONPATH=$R timeout 70 python3 .device/twopass.py $W/c1/twopass.json > $W/c1/twopass.log 2>&1; echo "twopass rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|synccheck)" $OUT/run.log
tar -cf $OUT/c1.tar -C $W c1
