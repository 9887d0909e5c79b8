#!/usr/bin/env bash
# Session 14 call 5: the final tree (v6 = HEAD's csrc): every CUDA test;
# memcheck, racecheck, synccheck.
set -u
export PYTHONUNBUFFERED=1
cp .device/s14/v6.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
PREBUILT=1 SANITIZE_TOOLS="memcheck racecheck synccheck" STEP_LIMIT_TESTS=240 \
 bash scripts/gpu_check.sh tests,sanitize tests -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| (memcheck|racecheck|synccheck)" $OUT/run.log
