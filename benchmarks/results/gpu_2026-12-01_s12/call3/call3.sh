#!/usr/bin/env bash
# Session 12 call 3 (final tree): sorted fetch in the 2-byte spmm kernels only
# (the forward's transposed gather as a kernel of its own, launched when a warp
# runs several rows; the dot-gather); the fused attention kernels and
# float32/float64 as main. baseline = main 5d87d79. Every CUDA test, bench_kernels of baseline, tree,
# tree with the sort off; memcheck + racecheck + synccheck; bench_ops.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c3
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/baseline/pyg_multihead_agg/_C.abi3.so > $W/c3/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_LIMIT=90 \
 STEP_LIMIT_TESTS=210 STEP_LIMIT_KERNELS=90 STEP_LIMIT_OPS=120 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize,ops tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
PYG_MULTIHEAD_AGG_SORT_FETCH=0 PYTHONPATH=$R timeout 90 python3 benchmarks/bench_kernels.py $KA \
  --out $W/c3/nosort > $W/c3/nosort.log 2>&1; echo "nosort rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
tar -cf $OUT/c3.tar -C $W c3
