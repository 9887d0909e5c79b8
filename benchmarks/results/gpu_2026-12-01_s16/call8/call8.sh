#!/usr/bin/env bash
# Session 16 call 8: t5 = t4 with both tensor-core kernels driven by one
# loop (tc_run; review of the duplicates). The spmm / malformed / ops CUDA
# tests, bench_kernels bf16 (arxiv-, products-like), and memcheck, racecheck,
# synccheck on the tensor-core tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s16/t5.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
timeout 150 python3 -m pytest tests/test_cuda_kernels.py tests/test_malformed.py tests/test_ops.py \
  -k cuda -q -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc=$? $(tail -1 $OUT/tests.log)"
timeout 40 python3 benchmarks/bench_kernels.py --shapes arxiv-like,products-like --dtypes bfloat16 \
  --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep spmm_fwd $OUT/bench.log | cut -c1-60
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
K=tests/test_cuda_kernels.py
TC="$K::test_tensor_core_forward[4-32-dtype1] $K::test_tensor_core_forward[8-16-dtype0]
 $K::test_tensor_core_forward_non_finite[dtype1-index_dtype0]
 $K::test_tensor_core_forward_malformed_and_unaligned[index_dtype0]
 $K::test_tensor_core_forward_malformed_and_unaligned[index_dtype1]"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool != memcheck ] && extra="--kernel-name kns=pyg_multihead_agg"
  [ $tool = racecheck ] && extra="$extra --racecheck-report all"
  timeout 80 $CS --tool $tool --error-exitcode 1 --print-limit 50 --report-api-errors no $extra \
    python3 -m pytest -q -p no:cacheprovider $TC > $OUT/$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | tail -1) $(tail -1 $OUT/$tool.log)"
done
