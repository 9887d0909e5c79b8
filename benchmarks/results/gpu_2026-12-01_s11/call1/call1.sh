#!/usr/bin/env bash
# Session 11 call 1: tree = cp.async staging of the transposed gathers
# (gather_entries_async, dot_entries_async; 2 stages); var = 3 stages
# (-DPMA_ASYNC_STAGES=3, multihead_spmm.cu only); var5 = 2 stages with the
# dot-gather at 5 blocks (96 registers); baseline = 64aebba.
# Every CUDA test on the tree, memcheck + racecheck, bench_kernels of
# baseline / tree / var, then Nsight Compute (warp states + per-SASS
# source counters) of the bf16 arxiv-like gather and dot-gather, base and tree.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; V=$R/.device/var; B=$R/.device/baseline
md5sum $R/pyg_multihead_agg/_C.abi3.so $V/pyg_multihead_agg/_C.abi3.so $R/.device/var5/pyg_multihead_agg/_C.abi3.so $B/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
PREBUILT=1 KERNELS_ARGS="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16" \
 SANITIZE_TOOLS="memcheck racecheck initcheck" \
 STEP_LIMIT_TESTS=170 STEP_LIMIT_KERNELS=80 STEP_LIMIT_SANITIZE=80 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
(cd $V && PYTHONPATH=$V timeout 80 python3 benchmarks/bench_kernels.py --shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16 --out $OUT/var) > $OUT/var.log 2>&1
echo "var rc=$?"
V5=$R/.device/var5
(cd $V5 && PYTHONPATH=$V5 timeout 80 python3 benchmarks/bench_kernels.py --shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16 --out $OUT/var5) > $OUT/var5.log 2>&1
echo "var5 rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck)" $OUT/run.log
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
echo "ncu: $NCU"
for t in tree base; do
  d=$R; [ $t = base ] && d=$B
  (cd $d && PYTHONPATH=$d timeout 60 "$NCU" --clock-control none --profile-from-start off \
    --kernel-name "regex:^gather_kernel|dot_gather_kernel" --section WarpStateStats \
    --section SourceCounters --section Occupancy --section LaunchStats --section SpeedOfLight \
    -o $OUT/ncu_$t -f python3 benchmarks/bench_kernels.py --ncu --shapes arxiv-like --dtypes bfloat16) > $OUT/ncu_$t.log 2>&1
  echo "ncu $t rc=$?"
  timeout 30 "$NCU" --import $OUT/ncu_$t.ncu-rep --page details --csv > $OUT/ncu_${t}_details.csv 2>&1
  timeout 30 "$NCU" --import $OUT/ncu_$t.ncu-rep --page source --csv --print-source sass > $OUT/ncu_${t}_sass.csv 2>&1
  echo "export $t rc=$? $(wc -c < $OUT/ncu_${t}_sass.csv)"
done
