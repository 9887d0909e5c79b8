#!/usr/bin/env bash
# Session 20 call 3 (a1): where our compiled layer's graphs split on CUDA
# (fullgraph=True, inductor and aot_eager, with and without int32 indices);
# the bf16 layer rows, each peer in its own process (PyG compiled's bf16
# backward on products-like hit a misaligned address in an inductor
# kernel in call 2, which ends the process).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s20/a1.so pyg_multihead_agg/_C.abi3.so
T0=$(date +%s)
timeout 150 python3 .device/diag.py > $OUT/diag.log 2>&1; echo "diag rc=$? t=$(( $(date +%s) - T0 ))"
grep "^==" $OUT/diag.log
mkdir -p $OUT/l
for spec in "reddit-like|PyG edge_index compiled|EdgeIndex" "products-like|EdgeIndex" "products-like|PyG edge_index compiled"; do
  shape=${spec%%|*}; m=${spec#*|}; tag=$(echo "$shape$m" | tr -cd 'a-zA-Z')
  timeout 120 python3 benchmarks/bench_layer.py --device cuda --out $OUT/l --tag $tag --shapes $shape \
    --dtypes bfloat16 --methods "$m" > $OUT/l/$tag.log 2>&1; echo "$tag rc=$? t=$(( $(date +%s) - T0 ))"
done
grep -h "bfloat16 .*  ms\|ms  err" $OUT/l/*.log | cut -c1-160
(cd $OUT && tar czf l.tgz l && rm -rf l)
