#!/usr/bin/env bash
# Session 14 call 3: v5 = this tree (the spmm backward through perm_inv, no
# grad_weight memset; the weight gather of call 2 removed). The changed tests'
# CUDA cases; bench_kernels of baseline (main 52b1448) and v5; bench_ops
# (with the "CSC + perm_inv cached" backward); memcheck, racecheck, synccheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s14/v5.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" OPS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" \
 STEP_LIMIT_TESTS=120 STEP_LIMIT_KERNELS=100 STEP_LIMIT_OPS=150 \
 bash scripts/gpu_check.sh tests,kernels,baseline,ops,sanitize tests/test_cuda_kernels.py \
 tests/test_ops.py tests/test_gat_conv.py tests/test_malformed.py tests/test_bench_checks.py \
 -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "spmm_(fwd|bwd)" $OUT/run.log | cut -c1-60
grep -E "forward\+backward.*ours|forward .*ours" $OUT/run.log | cut -c1-140
