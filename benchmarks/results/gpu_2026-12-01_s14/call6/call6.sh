#!/usr/bin/env bash
# Session 14 call 6 (review mend): gather_rows_kernel moved to common.cuh and
# used for the fused backward's grad_s_edge (was index_select through a
# clamped perm_inv). The fused-attention, kernel and op CUDA tests; memcheck
# of the perm_inv cases.
set -u
export PYTHONUNBUFFERED=1
cp .device/s14/v8.so pyg_multihead_agg/_C.abi3.so
md5sum pyg_multihead_agg/_C.abi3.so > $OUT/sos.txt
PREBUILT=1 SANITIZE_TOOLS="memcheck" STEP_LIMIT_TESTS=200 \
 bash scripts/gpu_check.sh tests,sanitize tests/test_gat_attention.py tests/test_cuda_kernels.py \
 tests/test_ops.py tests/test_gat_conv.py -k cuda -m "not slow"
echo "gpu_check rc=$?"
grep -E "passed|failed" $OUT/tests.log | tail -2
grep -E "\| memcheck" $OUT/run.log
