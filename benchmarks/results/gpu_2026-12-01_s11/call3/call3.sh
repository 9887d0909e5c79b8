#!/usr/bin/env bash
# Session 11 call 3: tree = FetchRanges (a fetch's row pointers in one
# warp-wide load); baseline = 64aebba. Every CUDA test, bench_kernels of
# baseline and tree, memcheck + racecheck, bench_ops, bench_layer, profile.
# Everything but gpu_check's three files goes back in one tar.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c3
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/baseline/pyg_multihead_agg/_C.abi3.so > $W/c3/sos.txt
PREBUILT=1 KERNELS_ARGS="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16" \
 LAYER_ARGS="--shapes products-like,reddit-like --dtypes float32 --methods PyG|sparse_csr.eager|EdgeIndex" \
 SANITIZE_TOOLS="memcheck racecheck" \
 STEP_LIMIT_TESTS=170 STEP_LIMIT_KERNELS=80 STEP_LIMIT_OPS=100 STEP_LIMIT_LAYER=100 STEP_LIMIT_SANITIZE=80 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize,ops,layer tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
PYTHONPATH=$R timeout 40 python3 benchmarks/bench_kernels.py --profile --shapes arxiv-like,reddit-like --dtypes float32,bfloat16 --out $W/c3/profile > $W/c3/profile.log 2>&1
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck)" $OUT/run.log
tar -cf $OUT/c3.tar -C $W c3
