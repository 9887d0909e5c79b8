#!/usr/bin/env bash
# Session 15 call 4: f5 = this tree (the bounded slice lists only). Every
# CUDA test; bench_kernels of baseline (main ba963c9 = s14 v8) and f5;
# memcheck, racecheck, synccheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s15/f5.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so .device/baseline/pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
KA="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16"
PREBUILT=1 KERNELS_ARGS="$KA" SANITIZE_TOOLS="memcheck racecheck synccheck" STEP_LIMIT_TESTS=240 \
 STEP_LIMIT_KERNELS=100 \
 bash scripts/gpu_check.sh tests,kernels,baseline,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
grep -E "^(arxiv|products|reddit)-like .* spmm|^(arxiv|products|reddit)-like .* gat_|^== " $OUT/run.log \
 | grep -v "rel err" | cut -c1-60
