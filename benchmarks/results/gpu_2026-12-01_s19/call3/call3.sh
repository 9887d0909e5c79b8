#!/usr/bin/env bash
# Session 19 call 3: d2 (unchanged). benchmarks/backward_floor.py (the
# edge-ordered grad_weight's cost against the forward) and bench_kernels
# --profile (per-kernel times of each call).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s19/d2.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
timeout 200 python3 benchmarks/backward_floor.py --out $OUT/floor > $OUT/floor.log 2>&1; echo "floor rc=$?"
timeout 150 python3 benchmarks/bench_kernels.py --profile --shapes arxiv-like,products-like,reddit-like \
  --dtypes float32,bfloat16 --out $OUT/profile > $OUT/profile.log 2>&1; echo "profile rc=$?"
tail -12 $OUT/floor.log
grep -E "spmm_bwd_inv|spmm_fwd" $OUT/profile.log | cut -c1-150
