#!/usr/bin/env bash
# Session 16 call 6: t4 = this tree (the tensor-core forward, staged kernel
# for heads of 32 / 64 features, register kernel for 16, taken for rows of
# at most 64 entries on average). Every CUDA test; bench_kernels of the
# baseline (HEAD 5984f64 = s15 f5) and t4; bench_ops; the (H, D) probe;
# memcheck, racecheck, synccheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s16/t4.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" OPS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" \
 STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=100 STEP_LIMIT_OPS=150 \
 bash scripts/gpu_check.sh tests,kernels,baseline,ops,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
PYTHONPATH=$PWD timeout 100 python3 benchmarks/results/gpu_2026-12-01_s16/call4/tc_probe.py > $OUT/tc_probe.log 2>&1
echo "probe rc=$?"; cat $OUT/tc_probe.log
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm|^== " $OUT/run.log | grep -v "rel err" | cut -c1-62
