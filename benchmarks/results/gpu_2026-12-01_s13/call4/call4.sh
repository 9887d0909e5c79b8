#!/usr/bin/env bash
# Session 13 call 4: the fused attention backward without its grad_z stores
# (gz, ablation) against b2 (the same tree with them); the gather ceiling on
# arxiv-like with main's kernels (PYG_MULTIHEAD_AGG_BULK=0) beside it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s13/b2.so pyg_multihead_agg/_C.abi3.so
PYG_MULTIHEAD_AGG_BULK=0 timeout 120 python3 benchmarks/gather_ceiling.py --lib .device/s13/gc.so --ops \
  --shapes arxiv-like --out $OUT/ceiling_arxiv > $OUT/ceiling_arxiv.log 2>&1; echo "ceiling rc $?" >> $OUT/ceiling_arxiv.log
PYG_MULTIHEAD_AGG_BULK=0 timeout 120 python3 benchmarks/bench_kernels.py --shapes products-like,reddit-like \
  --out $OUT/k_b2 > $OUT/kernels_b2.log 2>&1; echo "rc $?" >> $OUT/kernels_b2.log
cp .device/s13/gz.so pyg_multihead_agg/_C.abi3.so
PYG_MULTIHEAD_AGG_BULK=0 timeout 120 python3 benchmarks/bench_kernels.py --shapes products-like,reddit-like \
  --no-check --out $OUT/k_gz > $OUT/kernels_gz.log 2>&1; echo "rc $?" >> $OUT/kernels_gz.log
grep -E "gat_bwd|rc" $OUT/kernels_b2.log $OUT/kernels_gz.log | cut -c1-110
grep -E "csr .*256 B|op " $OUT/ceiling_arxiv.log
