#!/usr/bin/env bash
# Session 19 call 4: d3 = d2 + A/B knobs for the gather into edge order
# (GATHER_UNROLL, GATHER_GRID, GATHER_CG; defaults = d2's kernel).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s19/d3.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
timeout 150 python3 benchmarks/backward_floor.py --out $OUT/floor > $OUT/floor.log 2>&1; echo "floor rc=$?"
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16 --calls spmm_bwd_inv"
for v in "4 0 0" "8 0 0" "2 1 0" "1 1 0" "4 0 1" "1 1 1"; do
  set -- $v
  PYG_MULTIHEAD_AGG_GATHER_UNROLL=$1 PYG_MULTIHEAD_AGG_GATHER_GRID=$2 PYG_MULTIHEAD_AGG_GATHER_CG=$3 \
    timeout 60 python3 benchmarks/bench_kernels.py $KA > $OUT/v_u$1g$2c$3.log 2>&1
  echo "variant $v rc=$?"
done
tail -9 $OUT/floor.log
for f in $OUT/v_*.log; do grep -E "spmm_bwd_inv" $f | sed "s#^#$(basename $f .log) #" | cut -c1-75; done
