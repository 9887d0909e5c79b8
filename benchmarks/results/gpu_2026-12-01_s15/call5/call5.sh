#!/usr/bin/env bash
# Session 15 call 5: f6 = this tree (f5 + the slices' sums and the gather
# into edge order in one launch). CUDA tests of kernels/ops/fused attention/
# malformed; bench_kernels of baseline (main ba963c9) and f6; f6 with
# FUSE_TAIL=0 (A/B, arxiv); arxiv profile; memcheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s15/f6.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" STEP_LIMIT_TESTS=150 STEP_LIMIT_KERNELS=90 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests/test_cuda_kernels.py tests/test_ops.py \
 tests/test_gat_attention.py tests/test_malformed.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
A="--shapes arxiv-like --dtypes float32,bfloat16"
echo "== f6 FUSE_TAIL=0" | tee -a $OUT/run.log
PYG_MULTIHEAD_AGG_FUSE_TAIL=0 timeout 40 python3 benchmarks/bench_kernels.py --out $OUT/f6_two $A >> $OUT/run.log 2>&1
echo "== f6 default" | tee -a $OUT/run.log
timeout 40 python3 benchmarks/bench_kernels.py --out $OUT/f6_one $A >> $OUT/run.log 2>&1
echo "== profile" | tee -a $OUT/run.log
timeout 40 python3 benchmarks/bench_kernels.py --profile --out $OUT/profile $A > $OUT/profile.log 2>&1
grep -E "\| memcheck" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm|^== " $OUT/run.log | grep -v "rel err" | cut -c1-60
grep -E "spmm_bwd_inv" $OUT/profile.log | cut -c1-150 | head -20
