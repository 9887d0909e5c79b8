#!/usr/bin/env bash
# Session 19 call 2: d2 = this tree (the gather into edge order evict-first;
# the 2-byte fused backward's slices at max(64, E / 131072)). Every CUDA
# test; memcheck; bench_kernels fp32 + bf16; the layer (products-, reddit-
# like): fp32 against PyG compiled, bf16 ours eager.
set -u
export PYTHONUNBUFFERED=1
cp .device/s19/d2.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" SANITIZE_LIMIT=100 \
 STEP_LIMIT_TESTS=220 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
M="PyG edge_index compiled|EdgeIndex eager|EdgeIndex compiled"
timeout 120 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer.log 2>&1; echo "layer rc $?"
timeout 80 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer_bf16 --shapes products-like,reddit-like \
  --dtypes bfloat16 --methods "EdgeIndex eager" > $OUT/layer_bf16.log 2>&1; echo "layer bf16 rc $?"
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E " (spmm_fwd|spmm_bwd_inv|spmm_bwd_x|gat_fwd|gat_bwd_inv) " $OUT/run.log | cut -c1-62
grep -E "^\| (products|reddit)" $OUT/layer/*.md $OUT/layer_bf16/*.md | cut -d'|' -f2-9
