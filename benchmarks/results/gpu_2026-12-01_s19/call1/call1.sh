#!/usr/bin/env bash
# Session 19 call 1: d1 = this tree (SLICE_DIV, GATHER_STREAM knobs; defaults
# = session 18's kernels). Tests at DIV 16 / STREAM 1; bench_kernels sweep.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s19/d1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
PYG_MULTIHEAD_AGG_SLICE_DIV=16 PYG_MULTIHEAD_AGG_GATHER_STREAM=1 timeout 120 python3 -m pytest \
  tests/test_cuda_kernels.py tests/test_gat_attention.py tests/test_ops.py \
  -k "hub or tensor_core_backward or every_specialisation or perm_inv or many_rows or sliced" \
  -m "not slow" -q -p no:cacheprovider -x > $OUT/tests_div16.log 2>&1
echo "tests div16 rc=$?"; tail -1 $OUT/tests_div16.log
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16 --calls spmm_fwd,spmm_bwd_inv,gat_fwd,gat_bwd_inv"
for d in 1 2 4 8; do
  PYG_MULTIHEAD_AGG_SLICE_DIV=$d timeout 80 python3 benchmarks/bench_kernels.py $KA --out $OUT/div$d > $OUT/div$d.log 2>&1
  echo "div $d rc=$?"
done
PYG_MULTIHEAD_AGG_GATHER_STREAM=1 timeout 80 python3 benchmarks/bench_kernels.py $KA --out $OUT/stream > $OUT/stream.log 2>&1
echo "stream rc=$?"
for d in div1 div2 div4 div8 stream; do grep -E " (spmm_fwd|spmm_bwd_inv|gat_fwd|gat_bwd_inv) " $OUT/$d.log | sed "s/^/$d /" | cut -c1-70; done
