#!/usr/bin/env bash
# Session 15 call 1: f1 (this tree: the spmm backward sums its slices in the
# pass, finish_slice; slice lists bounded for overlapping pointers).
# CUDA tests of kernels/ops/fused attention/malformed/layer; bench_kernels of
# baseline (main ba963c9 = s14 v8) and f1; f1 with FUSED_SLICE_SUM=0;
# per-kernel profile on arxiv-like; memcheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s15/f1.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests/test_cuda_kernels.py tests/test_ops.py \
 tests/test_gat_attention.py tests/test_malformed.py tests/test_gat_conv.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
echo "== f1 FUSED_SLICE_SUM=0" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_FUSED_SLICE_SUM=0 timeout 60 python3 benchmarks/bench_kernels.py --out $OUT/f1_unfused \
  --shapes arxiv-like --dtypes float32,bfloat16 >> $OUT/run.log 2>&1
echo "== profile" | tee -a $OUT/run.log
timeout 60 python3 benchmarks/bench_kernels.py --profile --out $OUT/profile \
  --shapes arxiv-like --dtypes float32,bfloat16 > $OUT/profile.log 2>&1
grep -E "\| memcheck" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* ms|^== " $OUT/run.log | grep -v "rel err" | cut -c1-60
grep -E "spmm_bwd|spmm_fwd" $OUT/profile.log | cut -c1-150 | head -40
