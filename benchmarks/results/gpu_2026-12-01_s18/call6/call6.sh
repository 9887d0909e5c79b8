#!/usr/bin/env bash
# Session 18 call 6: c6 = the review's tree (the kernel choice of the
# tensor-core backward in one tc_dot_kernel_for; SASS of all 406 kernels
# identical to c5). The tensor-core tests, the kernel-name test included,
# and the op checks.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s18/c6.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
timeout 150 python3 -m pytest tests/test_cuda_kernels.py -k "tensor_core or every_specialisation or hub or unaligned" \
  -q -p no:cacheprovider --timeout 120 > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -1 $OUT/tests.log
