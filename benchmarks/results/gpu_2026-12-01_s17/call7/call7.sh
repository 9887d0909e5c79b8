#!/usr/bin/env bash
# Session 17 call 7: b4 and the baseline (bdc5a16): the arxiv-like forward +
# backward probe (event time, host enqueue time, kernel time per step).
# (Call 6 ran session 16's call6.sh by mistake: this file had not been
# written; its output is discarded.)
set -u
export PYTHONUNBUFFERED=1
P=benchmarks/results/gpu_2026-12-01_s17/call7/fwdbwd_probe.py
cp .device/s17/b4.so pyg_multihead_agg/_C.abi3.so
PYTHONPATH=$PWD timeout 150 python3 $P > $OUT/probe_b4.log 2>&1; echo "b4 rc=$?"
cp $P .device/baseline/probe.py
(cd .device/baseline && PYTHONPATH=$PWD timeout 150 python3 probe.py > $OUT/probe_base.log 2>&1; echo "base rc=$?")
grep -h "event median" $OUT/probe_b4.log $OUT/probe_base.log
