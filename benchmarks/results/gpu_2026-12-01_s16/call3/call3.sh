#!/usr/bin/env bash
# Session 16 call 3: Nsight Compute of the bf16 arxiv-like forward, t1
# (tc_gather_kernel, forced) against the baseline's gather_kernel: speed of
# light, memory, warp states, scheduler, and per-SASS source counters.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; B=$R/.device/baseline
cp .device/s16/t1.so pyg_multihead_agg/_C.abi3.so
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
echo "ncu: $NCU"
for t in tree base; do
  d=$R; [ $t = base ] && d=$B
  (cd $d && PYG_MULTIHEAD_AGG_TENSOR_CORES=1 PYTHONPATH=$d timeout 100 "$NCU" --clock-control none \
    --profile-from-start off --kernel-name "regex:^gather_kernel|tc_gather_kernel" \
    --section WarpStateStats --section SourceCounters --section Occupancy --section LaunchStats \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    -o $OUT/ncu_$t -f python3 benchmarks/bench_kernels.py --ncu --shapes arxiv-like,products-like \
    --dtypes bfloat16) > $OUT/ncu_$t.log 2>&1
  echo "ncu $t rc=$?"
  timeout 40 "$NCU" --import $OUT/ncu_$t.ncu-rep --page details --csv > $OUT/ncu_${t}_details.csv 2>&1
  timeout 40 "$NCU" --import $OUT/ncu_$t.ncu-rep --page source --csv --print-source sass > $OUT/ncu_${t}_sass.csv 2>&1
  echo "export $t rc=$? $(wc -c < $OUT/ncu_${t}_sass.csv)"
  gzip $OUT/ncu_${t}_sass.csv; rm -f $OUT/ncu_$t.ncu-rep
done
tail -3 $OUT/ncu_tree.log
