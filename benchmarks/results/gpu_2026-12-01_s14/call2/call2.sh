#!/usr/bin/env bash
# Session 14 call 2: v4 (this tree: spmm backward through perm_inv with the
# weights gathered into CSC order; sort/dot knobs reverted). Every CUDA test;
# bench_kernels of baseline (main 52b1448) and v4; v4 with
# PYG_MULTIHEAD_AGG_WEIGHT_BY_ENTRY=0; the per-kernel profile of products/reddit.
set -u
export PYTHONUNBUFFERED=1
cp .device/s14/v4.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" STEP_LIMIT_TESTS=260 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
echo "== v4 WEIGHT_BY_ENTRY=0" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_WEIGHT_BY_ENTRY=0 timeout 80 python3 benchmarks/bench_kernels.py --out $OUT/v4_wbe0 \
  $KA >> $OUT/run.log 2>&1
echo "== profile" | tee -a $OUT/run.log
timeout 80 python3 benchmarks/bench_kernels.py --profile --out $OUT/profile \
  --shapes products-like,reddit-like --dtypes float32,bfloat16 > $OUT/profile.log 2>&1
grep -E "^(arxiv|products|reddit)-like .* ms|^== " $OUT/run.log | grep -v "rel err" | cut -c1-60
grep -E "spmm_bwd" $OUT/profile.log | cut -c1-150 | head -40
