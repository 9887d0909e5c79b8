#!/usr/bin/env bash
# Session 20 call 2: a1 (main's kernels; host knobs off) against a2 (a1 +
# evict-first stores of outputs written once, -DPMA_STREAM_STORES=1), twice
# interleaved; then the layer (forward and forward + backward, float32 and
# bf16, PyG compiled and ours) on a1.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/k
md5sum .device/s20/*.so > $OUT/k/sos.txt
S="--shapes arxiv-like,products-like,reddit-like --dtypes float32,bfloat16 --calls spmm_fwd,spmm_bwd_inv,gat_fwd,gat_bwd_inv"
T0=$(date +%s)
for b in a1 a2 a1 a2; do
  cp .device/s20/$b.so pyg_multihead_agg/_C.abi3.so
  timeout 70 python3 benchmarks/bench_kernels.py $S >> $OUT/k/k_$b.log 2>&1
  echo "$b rc=$? t=$(( $(date +%s) - T0 ))"
done
cp .device/s20/a1.so pyg_multihead_agg/_C.abi3.so
M="PyG edge_index compiled|EdgeIndex eager|EdgeIndex compiled"
mkdir -p $OUT/layer; timeout 330 python3 benchmarks/bench_layer.py --device cuda --out $OUT/layer --shapes products-like,reddit-like \
  --dtypes float32,bfloat16 --methods "$M" > $OUT/layer/layer.log 2>&1 || echo "layer rc=$?"
mkdir -p $OUT/layer; echo "layer t=$(( $(date +%s) - T0 ))"
(cd $OUT && tar czf k.tgz k && rm -rf k)
for b in a1 a2; do grep -E " (spmm_fwd|spmm_bwd_inv|gat_fwd|gat_bwd_inv) .* ms" $OUT/../k_$b.log 2>/dev/null; done
tar xzf $OUT/k.tgz -O 2>/dev/null | grep -E " (spmm_fwd|spmm_bwd_inv|gat_fwd|gat_bwd_inv) .* ms" | cut -c1-60 | paste - - - - 
grep -E "^\| (products|reddit)" $OUT/layer/*.md | cut -d'|' -f2-11
