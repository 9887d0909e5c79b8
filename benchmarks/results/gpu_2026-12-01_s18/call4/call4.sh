#!/usr/bin/env bash
# Session 18 call 4: c5 = this tree (c4 + PYG_MULTIHEAD_AGG_SLICE_SCALE, the
# backwards' long-row threshold and slice length in multiples of the work
# lists'; default 1 = c4). bench_kernels fp32 + bf16 at scales 1, 2, 4, 8;
# the sliced-row tests at scale 8 and 16.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s18/c5.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
for s in 1 2 4 8; do
  PYG_MULTIHEAD_AGG_SLICE_SCALE=$s timeout 70 python3 benchmarks/bench_kernels.py $KA --out $OUT/scale$s > $OUT/scale$s.log 2>&1
  echo "scale $s rc=$?"
done
for s in 8 16; do
  PYG_MULTIHEAD_AGG_SLICE_SCALE=$s timeout 100 python3 -m pytest tests/test_cuda_kernels.py tests/test_gat_attention.py \
    -k "hub or tensor_core_backward or every_specialisation or perm_inv or many_rows" -m "not slow" -q -p no:cacheprovider \
    > $OUT/tests_scale$s.log 2>&1
  echo "tests scale $s rc=$?"; tail -1 $OUT/tests_scale$s.log
done
for s in 1 2 4 8; do grep -E "spmm_bwd_(inv|x|csc)|gat_bwd" $OUT/scale$s.log | sed "s/^/s$s /" | cut -c1-64; done
