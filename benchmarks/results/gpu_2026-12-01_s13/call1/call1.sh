#!/usr/bin/env bash
# Session 13 call 1: the gather ceiling against the package's calls; the layer profile.
set -uo pipefail
cp .device/s13/vF.so pyg_multihead_agg/_C.abi3.so
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
timeout 300 python3 benchmarks/gather_ceiling.py --lib .device/s13/gc.so --ops --out $OUT \
  --shapes products-like,reddit-like > $OUT/ceiling.log 2>&1; echo "ceiling rc $?" >> $OUT/ceiling.log
timeout 200 python3 benchmarks/profile_layer.py --shapes products-like,reddit-like > $OUT/profile_layer.md 2>&1
echo "profile rc $?" >> $OUT/profile_layer.md
tail -5 $OUT/ceiling.log
