#!/usr/bin/env bash
# Session 17 call 8: the arxiv-like forward + backward probe, in turn for
# b5 (b4 + the tensor-core kernels' launch queries cached), the baseline
# (bdc5a16), b4 and b5 again (the order shows drift of the host); then the
# tensor-core, op and malformed CUDA tests and bench_kernels bf16 on b5.
set -u
export PYTHONUNBUFFERED=1
P=benchmarks/results/gpu_2026-12-01_s17/call7/fwdbwd_probe.py
cp $P .device/baseline/probe.py
md5sum .device/s17/*.so > $OUT/sos.txt
run() {  # $1 = b4 | b5 | base, $2 = log name
  if [ "$1" = base ]; then
    (cd .device/baseline && PYTHONPATH=$PWD timeout 100 python3 probe.py > $OUT/$2.log 2>&1)
  else
    cp .device/s17/$1.so pyg_multihead_agg/_C.abi3.so
    PYTHONPATH=$PWD timeout 100 python3 $P > $OUT/$2.log 2>&1
  fi
  echo "== $2 rc=$?"; grep -h "event median" $OUT/$2.log
}
run b5 probe1_b5; run base probe2_base; run b4 probe3_b4; run b5 probe4_b5
cp .device/s17/b5.so pyg_multihead_agg/_C.abi3.so
export PYTHONPATH=$PWD
timeout 120 python3 -m pytest tests/test_cuda_kernels.py tests/test_ops.py tests/test_malformed.py -k "cuda and (tensor_core or perm_inv or every_specialisation or malformed or nan_and_inf)" -q -p no:cacheprovider --timeout 60 > $OUT/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/tests.log
timeout 80 python3 benchmarks/bench_kernels.py --shapes arxiv-like,products-like,reddit-like --dtypes bfloat16 --out $OUT/b5 > $OUT/bench_b5.log 2>&1; echo "bench rc=$?"
grep -E "spmm_(fwd|bwd)" $OUT/bench_b5.log | cut -c1-64
