#!/usr/bin/env bash
# Session 16 call 5: the staged tensor-core forward (cp.async ring + ldmatrix,
# PYG_MULTIHEAD_AGG_TC_STAGED=1) against t1's register version (same build,
# STAGED=0) and the baseline, bf16, forced on, three shapes:
#   t3a = staged at 3 blocks/SM (24 warps, 64 KB of ring a block)
#   t3b = staged at 2 blocks/SM (16 warps)
# The tensor-core tests on each, staged, and the (H, D) probe.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
KA="--shapes arxiv-like,products-like,reddit-like --dtypes bfloat16"
(cd .device/baseline && PYTHONPATH=$PWD timeout 60 python3 benchmarks/bench_kernels.py $KA \
  --out $OUT/base > $OUT/bench_base.log 2>&1); echo "base rc=$?"
for v in t3a t3b; do
  cp .device/s16/$v.so pyg_multihead_agg/_C.abi3.so
  PYG_MULTIHEAD_AGG_TC_STAGED=1 timeout 60 python3 -m pytest tests/test_cuda_kernels.py \
    -k "tensor_core" -q -x -p no:cacheprovider > $OUT/tests_$v.log 2>&1
  echo "$v tests rc=$? $(tail -1 $OUT/tests_$v.log)"
  for st in 1 0; do
    PYG_MULTIHEAD_AGG_TC_STAGED=$st PYG_MULTIHEAD_AGG_TENSOR_CORES=1 timeout 60 python3 \
      benchmarks/bench_kernels.py $KA --out $OUT/${v}_$st > $OUT/bench_${v}_$st.log 2>&1
    echo "$v staged=$st bench rc=$?"
  done
done
cp .device/s16/t3a.so pyg_multihead_agg/_C.abi3.so
PYG_MULTIHEAD_AGG_TC_STAGED=1 timeout 100 python3 benchmarks/results/gpu_2026-12-01_s16/call4/tc_probe.py > $OUT/tc_probe_staged.log 2>&1
echo "probe rc=$?"; cat $OUT/tc_probe_staged.log
for f in base t3a_1 t3a_0 t3b_1 t3b_0; do echo "## $f"; grep -E "spmm_fwd" $OUT/bench_$f.log | cut -c1-60; done
tail -5 $OUT/tests_t3a.log
