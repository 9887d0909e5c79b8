#!/usr/bin/env bash
# Session 18 call 5: c5 = main at 6ac7a55 (the final kernels, SASS identical
# to call 3's c4; host: the slice-scale knob). Every CUDA test, the new
# tuning-flag cases included.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s18/c5.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
git log -1 --format='commit %H %s' > $OUT/commit.txt 2>&1
timeout 250 python3 -m pytest tests -k cuda -m "not slow" -q -rs -p no:cacheprovider --timeout 120 > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "^FAILED" $OUT/tests.log | head
