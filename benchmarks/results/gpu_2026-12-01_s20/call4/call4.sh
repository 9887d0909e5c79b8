#!/usr/bin/env bash
# Session 20 call 4 (a1): where the unbacked symbols of the compiled layer
# on CUDA come from (the creation stack of u0), and which pieces compile.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cp .device/s20/a1.so pyg_multihead_agg/_C.abi3.so
timeout 100 python3 .device/diag2.py pieces > $OUT/pieces.log 2>&1; echo "pieces rc=$?"
grep "^==" $OUT/pieces.log
TORCH_LOGS="+dynamic" TORCHDYNAMO_EXTENDED_DEBUG_CREATE_SYMBOL="u0,u1" timeout 100 python3 .device/diag2.py layer > $OUT/layer.log 2>&1; echo "layer rc=$?"
grep -n "create_unbacked_symint u0 \|create_unbacked_symint u1 " $OUT/layer.log | head
grep -n -A40 "create_unbacked_symint u0 " $OUT/layer.log | grep -v "site-packages/torch/" | head -60
gzip $OUT/layer.log
