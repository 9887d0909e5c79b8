#!/usr/bin/env bash
# Session 15 call 2: f3 (this tree: bounded slice lists, slot owners written
# by the warp, small per-edge rows scattered into edge order). CUDA tests;
# bench_kernels of baseline (main ba963c9 = s14 v8) and f3; f3 forced to
# gather (arxiv) and to scatter (arxiv, products fp32); arxiv profile;
# memcheck; the overlapping-pointer tests under memcheck against the baseline.
set -u
export PYTHONUNBUFFERED=1
cp .device/s15/f3.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests/test_cuda_kernels.py tests/test_ops.py \
 tests/test_gat_attention.py tests/test_malformed.py tests/test_gat_conv.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
echo "== profile" | tee -a $OUT/run.log
timeout 60 python3 benchmarks/bench_kernels.py --profile --out $OUT/profile \
  --shapes arxiv-like --dtypes float32,bfloat16 > $OUT/profile.log 2>&1
echo "== f3 SCATTER_ROWS=0 arxiv" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_SCATTER_ROWS=0 timeout 60 python3 benchmarks/bench_kernels.py --out $OUT/f3_gather \
  --shapes arxiv-like --dtypes float32,bfloat16 >> $OUT/run.log 2>&1
echo "== f3 SCATTER_ROWS=1 arxiv, products fp32" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_SCATTER_ROWS=1 timeout 90 python3 benchmarks/bench_kernels.py --out $OUT/f3_scatter \
  --shapes arxiv-like,products-like --dtypes float32 >> $OUT/run.log 2>&1
echo "== default again arxiv" | tee -a $OUT/run.log
timeout 60 python3 benchmarks/bench_kernels.py --out $OUT/f3_again \
  --shapes arxiv-like --dtypes float32,bfloat16 >> $OUT/run.log 2>&1
echo "== baseline under memcheck, overlapping pointers" | tee -a $OUT/run.log
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
cp tests/test_cuda_kernels.py tests/test_gat_attention.py .device/baseline/tests/
(cd .device/baseline && PYTHONPATH=$PWD PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 "$CS" \
  --tool memcheck --print-limit 5 python3 -m pytest -q -p no:cacheprovider \
  "tests/test_cuda_kernels.py::test_malformed_graphs_do_not_fault" \
  "tests/test_gat_attention.py::test_overlapping_rows_do_not_fault_cuda" \
  > $OUT/baseline_memcheck.log 2>&1; echo "baseline memcheck rc=$?"; \
  python3 -c "import pyg_multihead_agg as m; print('package', m.__file__)") \
  | tee -a $OUT/run.log
grep -E "ERROR SUMMARY|Invalid|passed|failed" $OUT/baseline_memcheck.log | head -8 | tee -a $OUT/run.log
grep -E "\| memcheck" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm|^== " $OUT/run.log | grep -v "rel err" | cut -c1-60
grep -E "spmm_bwd" $OUT/profile.log | cut -c1-150 | head -40
