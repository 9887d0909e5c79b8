#!/usr/bin/env bash
# Session 17 call 9: b6 = the review-mended tree (SASS identical to b5's).
# The new test_tensor_core_kernels_are_the_ones_that_run and the other
# tensor-core tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s17/b6.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
timeout 150 python3 -m pytest tests/test_cuda_kernels.py -k "tensor_core" -q -p no:cacheprovider --timeout 60 > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/tests.log
