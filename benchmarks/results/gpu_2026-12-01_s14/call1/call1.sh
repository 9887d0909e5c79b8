#!/usr/bin/env bash
# Session 14 call 1: v3 (sort step 4 at 32 warps, dot U4 at 24 warps, spmm
# backward through perm_inv, no grad_weight memset) against baseline (main
# 52b1448, p1 build); v2 (sort step 4 at 24 warps, dot U4 at 32 warps).
set -u
export PYTHONUNBUFFERED=1
cp .device/s14/v3.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/s14/*.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline tests/test_cuda_kernels.py tests/test_ops.py \
 tests/test_gat_conv.py tests/test_malformed.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
echo "== v3 DOT_STEP=4" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_DOT_STEP=4 timeout 80 python3 benchmarks/bench_kernels.py --out $OUT/v3_dot4 \
  --shapes arxiv-like,products-like,reddit-like --dtypes bfloat16 >> $OUT/run.log 2>&1
cp .device/s14/v2.so pyg_multihead_agg/_C.abi3.so
echo "== v2 DOT_STEP=4" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_DOT_STEP=4 timeout 80 python3 benchmarks/bench_kernels.py --out $OUT/v2_dot4 \
  --shapes arxiv-like,products-like,reddit-like --dtypes bfloat16 >> $OUT/run.log 2>&1
grep -E "^(arxiv|products|reddit)-like .* ms" $OUT/run.log | grep -v "rel err" | cut -c1-60
