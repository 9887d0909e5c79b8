#!/usr/bin/env bash
# Session 11 call 2: call 1's kernel timings again (its $OUT held too many
# files to come back): bench_kernels of baseline (64aebba), tree (2-stage
# cp.async), var (3 stages), var5 (2 stages, dot-gather at 5 blocks), in
# that order, all in one run; initcheck of the tree. One tar back.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; W=$(mktemp -d); mkdir -p $W/c2
md5sum $R/pyg_multihead_agg/_C.abi3.so $R/.device/*/pyg_multihead_agg/_C.abi3.so > $W/c2/sos.txt
A="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
for t in baseline tree var var5; do
  d=$R/.device/$t; [ $t = tree ] && d=$R
  (cd $d && PYTHONPATH=$d timeout 75 python3 benchmarks/bench_kernels.py $A --out $W/c2/$t) > $W/c2/$t.log 2>&1
  echo "$t rc=$?"
done
PYTHONPATH=$R SANITIZE_LIMIT=70 timeout 80 bash scripts/sanitize.sh $W/c2/sanitize_summary.md initcheck > $W/c2/sanitize.log 2>&1
echo "initcheck rc=$?"; cat $W/c2/sanitize_summary.md
tar -cf $OUT/c2.tar -C $W c2
