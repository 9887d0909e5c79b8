#!/usr/bin/env bash
# Session 17 call 5: b4 again (same .so as call 4); the test fix of
# check_all_ops (a weight view at an odd offset is compared with its own run
# without perm_inv: 2-byte types with H * D = 128 take other kernels for it).
# The CUDA tests of test_cuda_kernels.py, test_ops.py, test_malformed.py;
# memcheck, racecheck, synccheck.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s17/b4.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
timeout 200 python3 -m pytest tests/test_cuda_kernels.py tests/test_ops.py tests/test_malformed.py -k cuda -m "not slow" -q -p no:cacheprovider --timeout 120 > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/tests.log
SANITIZE_BUILD=0 bash scripts/sanitize.sh $OUT/sanitize_summary.md memcheck racecheck synccheck > $OUT/sanitize.log 2>&1
echo "sanitize rc=$?"; cat $OUT/sanitize_summary.md
