#!/usr/bin/env bash
# Session 13 call 3: why the bulk backward is not faster. Ablation builds
# (a1: no grad_weight stores, a2: no weight copies, a3: neither, s32: 32
# stages) against b2 (bulk, BULK=1 and 0), then ncu of both kernels.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d)
for v in b2 a1 a2 a3 s32; do
  cp .device/s13/$v.so pyg_multihead_agg/_C.abi3.so
  PYTHONPATH=$R timeout 60 python3 .device/s13/time_bwd.py bulk-$v products-like,reddit-like >> $OUT/ablate.log 2>&1
  if [ $v = b2 ]; then
    PYG_MULTIHEAD_AGG_BULK=0 PYTHONPATH=$R timeout 60 python3 .device/s13/time_bwd.py register products-like,reddit-like >> $OUT/ablate.log 2>&1
  fi
done
cp .device/s13/b2.so pyg_multihead_agg/_C.abi3.so
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
for B in 1 0; do
  (PYG_MULTIHEAD_AGG_BULK=$B PYTHONPATH=$R timeout 150 "$NCU" --clock-control none --profile-from-start off \
    --kernel-name "regex:dot_bulk_kernel|dot_gather_kernel" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    -o $W/ncu_bulk$B -f python3 benchmarks/bench_kernels.py --ncu --shapes products-like,reddit-like) > $W/ncu_bulk$B.log 2>&1
  echo "ncu bulk=$B rc=$?" >> $OUT/ablate.log
  timeout 60 "$NCU" --import $W/ncu_bulk$B.ncu-rep --page details --csv > $OUT/ncu_bulk${B}_details.csv 2>&1
done
tail -3 $W/ncu_bulk1.log >> $OUT/ablate.log
cat $OUT/ablate.log
