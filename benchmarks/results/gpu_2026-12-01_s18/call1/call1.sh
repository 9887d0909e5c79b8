#!/usr/bin/env bash
# Session 18 call 1: c2 = this tree (grad_x-only tensor-core backward,
# kDots = false, 3 blocks an SM; the compiled layer's perm_inv). Every CUDA
# test; bench_kernels fp32 + bf16 of the baseline (333395d, b8 build) and c2;
# bf16 spmm_bwd_x with TENSOR_CORES=0 (the register gather, i.e. before) and
# =1 (forced, reddit-like too), and c1g2 (2 blocks an SM) forced.
set -u
export PYTHONUNBUFFERED=1
cp .device/s18/c2.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so .device/s18/*.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" STEP_LIMIT_TESTS=230 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
KB="--shapes arxiv-like,products-like,reddit-like --dtypes bfloat16"
for v in 0 1; do
  PYG_MULTIHEAD_AGG_TENSOR_CORES=$v timeout 80 python3 benchmarks/bench_kernels.py $KB --out $OUT/tc$v > $OUT/tc$v.log 2>&1
  echo "tc$v rc=$?"
done
cp .device/s18/c1g2.so pyg_multihead_agg/_C.abi3.so
PYG_MULTIHEAD_AGG_TENSOR_CORES=1 timeout 80 python3 benchmarks/bench_kernels.py $KB --out $OUT/g2 > $OUT/g2.log 2>&1
echo "g2 rc=$?"
grep -E "spmm_(fwd|bwd)" $OUT/run.log $OUT/tc0.log $OUT/tc1.log $OUT/g2.log | cut -c1-90
