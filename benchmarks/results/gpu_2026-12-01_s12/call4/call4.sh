#!/usr/bin/env bash
# Session 12 call 4: Nsight Compute (warp states + per-SASS source counters)
# of the bf16 gather and dot-gather on arxiv- and products-like, final tree,
# with the fetch sorted (default) and not (PYG_MULTIHEAD_AGG_SORT_FETCH=0).
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c4
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
for s in 1 0; do
  (PYG_MULTIHEAD_AGG_SORT_FETCH=$s PYTHONPATH=$R timeout 150 "$NCU" --clock-control none --profile-from-start off \
    --kernel-name "regex:^gather_kernel|dot_gather_kernel" --section WarpStateStats \
    --section SourceCounters --section Occupancy --section LaunchStats --section SpeedOfLight \
    -o $W/c4/ncu_sort$s -f python3 benchmarks/bench_kernels.py --ncu --shapes arxiv-like,products-like --dtypes bfloat16) > $W/c4/ncu_sort$s.log 2>&1
  echo "ncu sort=$s rc=$?"
  timeout 40 "$NCU" --import $W/c4/ncu_sort$s.ncu-rep --page details --csv > $W/c4/ncu_sort${s}_details.csv 2>&1
  timeout 60 "$NCU" --import $W/c4/ncu_sort$s.ncu-rep --page source --csv --print-source sass > $W/c4/ncu_sort${s}_sass.csv 2>&1
  echo "export sort=$s rc=$? $(wc -c < $W/c4/ncu_sort${s}_sass.csv)"
  gzip -9 $W/c4/ncu_sort${s}_sass.csv; rm -f $W/c4/ncu_sort$s.ncu-rep
done
tar -cf $OUT/c4.tar -C $W c4
