#!/usr/bin/env bash
# Session 15 call 3: f4 (this tree: bounded slice lists; the spmm backward's
# dots by CSC entry kept in L2 where they fit, then discarded). CUDA tests;
# bench_kernels of baseline (main ba963c9 = s14 v8) and f4; f4 with
# DOTS_L2=0 (A/B, arxiv, twice around a default run); arxiv profile; memcheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s15/f4.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck" STEP_LIMIT_TESTS=200 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests/test_cuda_kernels.py tests/test_ops.py \
 tests/test_gat_attention.py tests/test_malformed.py tests/test_gat_conv.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
export PYTHONPATH=$PWD
A="--shapes arxiv-like --dtypes float32,bfloat16"
for run in l2off_1 default_1 l2off_2 default_2; do
  echo "== f4 $run" | tee -a $OUT/run.log
  case $run in l2off*) export PYG_MULTIHEAD_AGG_DOTS_L2=0;; *) unset PYG_MULTIHEAD_AGG_DOTS_L2;; esac
  timeout 60 python3 benchmarks/bench_kernels.py --out $OUT/f4_$run $A >> $OUT/run.log 2>&1
done
unset PYG_MULTIHEAD_AGG_DOTS_L2
echo "== profile" | tee -a $OUT/run.log
timeout 60 python3 benchmarks/bench_kernels.py --profile --out $OUT/profile $A > $OUT/profile.log 2>&1
PYG_MULTIHEAD_AGG_DOTS_L2=0 timeout 60 python3 benchmarks/bench_kernels.py --profile \
  --out $OUT/profile_l2off $A > $OUT/profile_l2off.log 2>&1
grep -E "\| memcheck" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm|^== " $OUT/run.log | grep -v "rel err" | cut -c1-60
grep -E "spmm_bwd_inv" $OUT/profile.log $OUT/profile_l2off.log | cut -c1-170 | head -40
