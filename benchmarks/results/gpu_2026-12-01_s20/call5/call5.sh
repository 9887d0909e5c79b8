#!/usr/bin/env bash
# Session 20 call 5: f1 = main at 575a82a (the evict-first stores; kernels
# SASS-identical to a2). Every CUDA test (with the new CUDA compile tests of
# the layer), memcheck, bench_kernels; the layer (both passes, float32 with
# PyG compiled; bf16 ours on reddit-like); diag (fullgraph on CUDA).
set -u
export PYTHONUNBUFFERED=1
cp .device/s20/f1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" SANITIZE_LIMIT=100 \
 STEP_LIMIT_TESTS=230 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
mkdir -p $OUT/layer
M="PyG edge_index compiled|EdgeIndex eager|EdgeIndex compiled"
timeout 130 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer/layer_fp32.log 2>&1; echo "layer rc $?"
timeout 45 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --tag bf16 --shapes reddit-like \
  --dtypes bfloat16 --methods "EdgeIndex eager|EdgeIndex compiled" > $OUT/layer/layer_bf16.log 2>&1; echo "layer bf16 rc $?"
timeout 40 python3 .device/diag.py > $OUT/layer/diag.log 2>&1; echo "diag rc $?"
grep "^==" $OUT/layer/diag.log
grep -E "\| memcheck" $OUT/run.log
grep -E " (spmm_fwd|spmm_bwd_inv|gat_fwd|gat_bwd_inv) " $OUT/run.log | cut -c1-62
grep -hE "^\| (products|reddit)" $OUT/layer/*.md | cut -d'|' -f2-12
grep -h "graphs" $OUT/layer/*.md | head
(cd $OUT && tar czf layer.tgz layer && rm -rf layer)
