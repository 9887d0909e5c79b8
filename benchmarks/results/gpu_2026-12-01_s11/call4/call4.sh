#!/usr/bin/env bash
# Session 11 call 4: main's kernels as they land (64aebba's csrc, its
# session-10 build): every CUDA test, memcheck + racecheck (their selections
# hold test_sliced_columns_every_size's hub case).
set -u
export PYTHONUNBUFFERED=1
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
PREBUILT=1 SANITIZE_TOOLS="memcheck racecheck" STEP_LIMIT_TESTS=170 STEP_LIMIT_SANITIZE=80 \
 bash scripts/gpu_check.sh tests,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
PYTHONPATH=$PWD timeout 60 python3 -m pytest tests/test_cuda_kernels.py -k sliced_columns_every_size -v -p no:cacheprovider > $OUT/sliced.log 2>&1; grep -cE "PASSED" $OUT/sliced.log; tail -1 $OUT/sliced.log
grep -E "\| (memcheck|racecheck)" $OUT/run.log
