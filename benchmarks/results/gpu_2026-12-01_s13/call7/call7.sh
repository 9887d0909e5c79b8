#!/usr/bin/env bash
# Session 13 call 7: the transposed gathers (spmm forward) at 4 blocks of 256
# threads (64 registers, 32 warps per SM; mb4 = this tree built with
# -DPMA_GATHER_TRANSPOSED_MIN_BLOCKS=4) against 3 (p1, the tree), same call.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
for v in p1 mb4 p1; do
  cp .device/s13/$v.so pyg_multihead_agg/_C.abi3.so
  timeout 100 python3 benchmarks/bench_kernels.py $KA --out $OUT/k_$v > $OUT/kernels_$v.log 2>&1
  echo "$v rc $?"; grep -E "spmm_fwd" $OUT/kernels_$v.log | cut -c1-60
done
