#!/usr/bin/env bash
# Session 16 call 2: variants of the tensor-core forward, all forced on
# (PYG_MULTIHEAD_AGG_TENSOR_CORES=1), bf16, three shapes, against the
# baseline (HEAD 5984f64 = s15 f5, register kernels) in the same call:
#   t1  = d5ef4cb: a warp per 8-row tile, 117 registers (16 warps/SM)
#   t2a = two parts per tile (a warp per 64 features), next item's atomic
#         prefetched, 80 registers (24 warps/SM)
#   t2b = the same at 64 registers (32 warps/SM, 28-132 bytes spilled)
#   t2c = one part per tile with the atomic prefetch (t1 + prefetch)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
KA="--shapes arxiv-like,products-like,reddit-like --dtypes bfloat16"
(cd .device/baseline && PYTHONPATH=$PWD timeout 60 python3 benchmarks/bench_kernels.py $KA \
  --out $OUT/base > $OUT/bench_base.log 2>&1); echo "base rc=$?"
for v in t2a t2b t2c t1; do
  cp .device/s16/$v.so pyg_multihead_agg/_C.abi3.so
  PYG_MULTIHEAD_AGG_TENSOR_CORES=1 timeout 60 python3 -m pytest tests/test_cuda_kernels.py \
    -k "tensor_core" -q -x -p no:cacheprovider > $OUT/tests_$v.log 2>&1
  echo "$v tests rc=$? $(tail -1 $OUT/tests_$v.log)"
  PYG_MULTIHEAD_AGG_TENSOR_CORES=1 timeout 60 python3 benchmarks/bench_kernels.py $KA \
    --out $OUT/$v > $OUT/bench_$v.log 2>&1; echo "$v bench rc=$?"
done
for v in base t2a t2b t2c t1; do echo "## $v"; grep -E "spmm_fwd" $OUT/bench_$v.log | cut -c1-60; done
