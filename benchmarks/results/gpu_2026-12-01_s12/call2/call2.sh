#!/usr/bin/env bash
# Session 12 call 2: tree = sorted fetch, 2-byte kernels only (FetchOrder<true>,
# identity table in shared memory; float32/float64 compile to main's code);
# baseline = main 5d87d79. Every CUDA test, bench_kernels of baseline, tree,
# tree with the sort off; memcheck + racecheck + synccheck; bench_ops.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c2
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/baseline/pyg_multihead_agg/_C.abi3.so > $W/c2/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_LIMIT=90 \
 STEP_LIMIT_TESTS=210 STEP_LIMIT_KERNELS=90 STEP_LIMIT_OPS=120 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize,ops tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
PYG_MULTIHEAD_AGG_SORT_FETCH=0 PYTHONPATH=$R timeout 90 python3 benchmarks/bench_kernels.py $KA \
  --out $W/c2/nosort > $W/c2/nosort.log 2>&1; echo "nosort rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
tar -cf $OUT/c2.tar -C $W c2
