#!/usr/bin/env bash
# Session 11 call 5: tree = branch s11-widen-bound built with
# -DPMA_BOUND_NO_WIDEN=1 (MEASUREMENT ONLY, wrong bf16 results); baseline =
# main (64aebba's build). bench_kernels, bf16, baseline then bound.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c5
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/baseline/pyg_multihead_agg/_C.abi3.so > $W/c5/sos.txt
A="--shapes arxiv-like,products-like,reddit-like --dtypes bfloat16"
for t in baseline bound; do
  d=$R/.device/baseline; [ $t = bound ] && d=$R
  (cd $d && PYTHONPATH=$d timeout 60 python3 benchmarks/bench_kernels.py $A --out $W/c5/$t) > $W/c5/$t.log 2>&1
  echo "$t rc=$?"
done
tar -cf $OUT/c5.tar -C $W c5
