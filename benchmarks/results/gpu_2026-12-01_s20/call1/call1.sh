#!/usr/bin/env bash
# Session 20 call 1: a1 = main (592f3ab) + two A/B knobs, host code only:
# PYG_MULTIHEAD_AGG_PERMUTE_WEIGHTS (spmm backward: weights gathered into CSC
# order first) and PYG_MULTIHEAD_AGG_ROWSUM_BLOCKS (fused backward's row sums:
# blocks an SM at most).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s20/a1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
S="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
T0=$(date +%s)
for pw in 0 1; do
  PYG_MULTIHEAD_AGG_PERMUTE_WEIGHTS=$pw timeout 75 python3 benchmarks/bench_kernels.py $S \
    --calls spmm_fwd,spmm_bwd_inv > $OUT/pw$pw.log 2>&1
  echo "pw $pw rc=$? t=$(( $(date +%s) - T0 ))"
done
for rb in 0 1 2 4; do
  PYG_MULTIHEAD_AGG_ROWSUM_BLOCKS=$rb timeout 75 python3 benchmarks/bench_kernels.py $S \
    --calls gat_bwd_inv > $OUT/rb$rb.log 2>&1
  echo "rb $rb rc=$? t=$(( $(date +%s) - T0 ))"
done
PYG_MULTIHEAD_AGG_PERMUTE_WEIGHTS=1 PYG_MULTIHEAD_AGG_ROWSUM_BLOCKS=1 timeout 100 python3 -m pytest -q -x \
  tests -k "cuda and (perm_inv or sliced or hub or backward)" -m "not slow" -p no:cacheprovider > $OUT/t_knobs.log 2>&1
echo "tests rc=$? t=$(( $(date +%s) - T0 ))"
tail -3 $OUT/t_knobs.log
for f in $OUT/pw*.log $OUT/rb*.log; do grep -E "(spmm_fwd|spmm_bwd_inv|gat_bwd_inv) .* ms|bitwise" $f | sed "s#^#$(basename $f .log) #" | cut -c1-72; done
