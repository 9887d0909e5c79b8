#!/usr/bin/env bash
# Session 13 call 2: the bulk-copy backward; kernel tests, then bench_kernels with BULK=1 / 0.
set -uo pipefail
cp .device/s13/b2.so pyg_multihead_agg/_C.abi3.so
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest tests/test_cuda_kernels.py -q -p no:cacheprovider --timeout 100 \
  -k "bulk or tuning or malformed or dot_products or empty_and or unaligned or deterministic" \
  > $OUT/tests_kernels.log 2>&1; echo "tests rc $?" >> $OUT/tests_kernels.log
tail -3 $OUT/tests_kernels.log
for B in 1 0; do
  PYG_MULTIHEAD_AGG_BULK=$B timeout 150 python3 benchmarks/bench_kernels.py \
    --shapes arxiv-like,products-like,reddit-like --out $OUT/k_bulk$B > $OUT/kernels_bulk$B.log 2>&1
  echo "bench rc $?" >> $OUT/kernels_bulk$B.log
  grep -E "spmm_bwd|rc" $OUT/kernels_bulk$B.log
done
