#!/usr/bin/env bash
# Session 14 call 4: v6 = this tree (v5 + the fused backward's grad_z no
# longer zero-filled). The fused-attention and layer CUDA tests (grad_z
# poisoned); bench_kernels of baseline (main 52b1448) and v6; the layer
# (products-, reddit-like, fp32) against PyG, and main's eager layer.
set -u
export PYTHONUNBUFFERED=1
cp .device/s14/v6.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" STEP_LIMIT_TESTS=150 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline tests/test_gat_attention.py tests/test_gat_conv.py \
 tests/test_cuda_kernels.py tests/test_malformed.py tests/test_determinism_autocast.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
M="PyG|sparse_csr eager|EdgeIndex eager|EdgeIndex compiled"
timeout 150 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer.log 2>&1; echo "layer rc $?"
(cd .device/baseline && PYTHONPATH=$PWD timeout 60 python3 benchmarks/bench_layer.py --device cuda \
  --out $OUT/layer_baseline --shapes products-like,reddit-like --dtypes float32 --methods "EdgeIndex eager" \
  --no-compile > $OUT/layer_baseline.log 2>&1; echo "baseline rc $?")
grep -E "gat_(fwd|bwd)" $OUT/run.log | cut -c1-60
grep -E "^\| (products|reddit)" $OUT/layer/*.md $OUT/layer_baseline/*.md | cut -d'|' -f2-8
