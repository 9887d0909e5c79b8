#!/usr/bin/env bash
# Session 13 call 8: is call 5's bf16 spmm forward gap (tree 3.74 / 1.75 ms
# against main's 3.58 / 1.59 on products- / reddit-like, with identical SASS)
# the kernels or the benchmark script? The tree's kernels (p1) timed by main's
# bench_kernels.py and by the tree's, alternately.
set -u
export PYTHONUNBUFFERED=1
cp .device/s13/p1.so pyg_multihead_agg/_C.abi3.so
KA="--shapes products-like,reddit-like --dtypes bfloat16"
for s in main tree main tree; do
  if [ $s = main ]; then B=.device/baseline/benchmarks/bench_kernels.py; else B=benchmarks/bench_kernels.py; fi
  PYTHONPATH=$PWD timeout 60 python3 $B $KA > $OUT/k_$s.log 2>&1
  echo "$s rc $?"; grep -E "spmm_fwd|gat_bwd" $OUT/k_$s.log | cut -c1-60
done
