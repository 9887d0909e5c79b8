#!/usr/bin/env bash
# Session 13 call 6: the layer (products-, reddit-like, float32) with perm_inv
# cached by the layer (p1 build), against PyG; baseline (main 10028d3) eager
# EdgeIndex in the same call; the layer cache test fixed after call 5.
set -u
export PYTHONUNBUFFERED=1
cp .device/s13/p1.so pyg_multihead_agg/_C.abi3.so
export PYTHONPATH=$PWD
timeout 120 python3 -m pytest tests/test_gat_conv.py -q -p no:cacheprovider -k "int64_graph_cached or cuda" \
  > $OUT/tests_conv.log 2>&1; tail -2 $OUT/tests_conv.log
M="PyG|sparse_csr eager|EdgeIndex eager|EdgeIndex compiled"
timeout 300 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32 --methods "$M" > $OUT/layer.log 2>&1; echo "layer rc $?"
(cd .device/baseline && PYTHONPATH=$PWD timeout 150 python3 benchmarks/bench_layer.py --device cuda \
  --out $OUT/layer_baseline --shapes products-like,reddit-like --dtypes float32 --methods "EdgeIndex eager" \
  --no-compile > $OUT/layer_baseline.log 2>&1; echo "baseline rc $?")
grep -E "^\| (products|reddit)" $OUT/layer/*.md $OUT/layer_baseline/*.md | cut -d'|' -f2-8
