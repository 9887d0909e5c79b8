#!/usr/bin/env bash
# Session 17 call 3: b3 = this tree (the tensor-core spmm backward with a
# ring of 3 stages; the copies' source index selected, also in the
# forward), b3s2 = the same at PMA_TC_DOT_STAGES=2. Tensor-core, malformed,
# NaN/inf and layout tests on b3; bench_kernels bf16 for b3, b3s2 and the
# register kernels (TENSOR_CORES=0, b3); the per-kernel profile of b3.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s17/b3.so pyg_multihead_agg/_C.abi3.so
md5sum .device/s17/*.so > $OUT/sos.txt
timeout 150 python3 -m pytest tests/test_cuda_kernels.py tests/test_malformed.py -k "tensor_core or malformed or nan_and_inf or layout or empty" -q -x -p no:cacheprovider --timeout 60 > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -4 $OUT/tests.log
KA="--shapes arxiv-like,products-like,reddit-like --dtypes bfloat16"
timeout 100 python3 benchmarks/bench_kernels.py $KA --out $OUT/b3 > $OUT/bench_b3.log 2>&1; echo "b3 rc=$?"
PYG_MULTIHEAD_AGG_TENSOR_CORES=0 timeout 100 python3 benchmarks/bench_kernels.py $KA --out $OUT/reg > $OUT/bench_reg.log 2>&1; echo "reg rc=$?"
cp .device/s17/b3s2.so pyg_multihead_agg/_C.abi3.so
timeout 100 python3 benchmarks/bench_kernels.py $KA --out $OUT/b3s2 > $OUT/bench_b3s2.log 2>&1; echo "b3s2 rc=$?"
cp .device/s17/b3.so pyg_multihead_agg/_C.abi3.so
timeout 90 python3 benchmarks/bench_kernels.py $KA --profile > $OUT/profile_b3.log 2>&1; echo "profile rc=$?"
for f in bench_b3 bench_b3s2 bench_reg; do echo "== $f"; grep -E "spmm_(fwd|bwd)" $OUT/$f.log | cut -c1-64; done
grep -E "spmm_bwd_inv .*(tc_dot|gather_rows)" $OUT/profile_b3.log | cut -c1-120
