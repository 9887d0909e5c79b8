#!/usr/bin/env bash
# Session 19 call 5: f1 = main at ec109c8 (the final tree; d4's kernels, one
# comment changed). Every CUDA test; memcheck; bench_kernels fp32 + bf16;
# bench_kernels --profile (the gather into edge order's time); the layer.
set -u
export PYTHONUNBUFFERED=1
cp .device/s19/f1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" SANITIZE_LIMIT=100 \
 STEP_LIMIT_TESTS=220 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
timeout 90 python3 benchmarks/bench_kernels.py --profile $KA > $OUT/profile.log 2>&1; echo "profile rc $?"
M="PyG edge_index compiled|EdgeIndex eager|EdgeIndex compiled"
timeout 120 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer.log 2>&1; echo "layer rc $?"
grep -E "\| memcheck" $OUT/run.log
grep -E " (spmm_fwd|spmm_bwd_inv|gat_fwd|gat_bwd_inv) " $OUT/run.log | cut -c1-62
grep -E "spmm_bwd_inv .*gather_rows" $OUT/profile.log | cut -c1-80
grep -E "^\| (products|reddit)" $OUT/layer/*.md | cut -d'|' -f2-9
