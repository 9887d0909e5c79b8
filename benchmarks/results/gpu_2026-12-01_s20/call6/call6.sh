#!/usr/bin/env bash
# Session 20 call 6: f1 kernels, main at HEAD (the compiled forward without
# gradients builds the CSR alone). The layer's CUDA compile tests; the layer
# float32 (both passes) against PyG compiled.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s20/f1.so pyg_multihead_agg/_C.abi3.so
timeout 80 python3 -m pytest -q tests/test_gat_conv.py tests/test_compile.py -k "compile or fullgraph or int32" -p no:cacheprovider > $OUT/tests.log 2>&1; echo "tests rc=$?"
tail -2 $OUT/tests.log
mkdir -p $OUT/layer
M="PyG edge_index compiled|EdgeIndex eager|EdgeIndex compiled"
timeout 110 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer/layer_fp32.log 2>&1; echo "layer rc $?"
grep -hE "^\| (products|reddit)" $OUT/layer/*.md | cut -d'|' -f2-12
grep -h "graph(s)" $OUT/layer/*.md
