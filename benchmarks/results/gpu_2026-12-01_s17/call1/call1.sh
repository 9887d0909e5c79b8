#!/usr/bin/env bash
# Session 17 call 1: b1 = this tree (the bf16/fp16 spmm backward on the
# tensor cores, tensor_core_backward.cuh). The tensor-core and malformed
# CUDA tests; bench_kernels bf16 with the tensor cores (default) and without
# (PYG_MULTIHEAD_AGG_TENSOR_CORES=0: register forward and dot-gather backward).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s17/b1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
timeout 150 python3 -m pytest tests/test_cuda_kernels.py tests/test_malformed.py -k "tensor_core or malformed or nan_and_inf or layout or empty" -q -x -p no:cacheprovider --timeout 60 > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -15 $OUT/tests.log
KA="--shapes arxiv-like,products-like,reddit-like --dtypes bfloat16"
timeout 120 python3 benchmarks/bench_kernels.py $KA --out $OUT/tc > $OUT/bench_tc.log 2>&1
echo "bench tc rc=$?"
PYG_MULTIHEAD_AGG_TENSOR_CORES=0 timeout 120 python3 benchmarks/bench_kernels.py $KA --out $OUT/reg > $OUT/bench_reg.log 2>&1
echo "bench reg rc=$?"
for f in bench_tc bench_reg; do echo "== $f"; grep -E "spmm" $OUT/$f.log | cut -c1-110; done
