#!/usr/bin/env bash
# Session 27 call 2: why call 1's replays of 3-4 steps ran ~2.5 % slower than one step a replay:
# traced steps (NERVA_TRACE addon) at 1 and 4 steps a replay (the last 24 steps of 256: the run's
# last steps are one a replay either way), then untraced again.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" cur=.device/cur
export BENCH=.device/dist4/bench.mjs
xz -dc .device/tcur/nerva_cuda.node.xz > /tmp/tcur.node
for k in 1 4; do
  env OUT="$AB/x" NERVA_CUDA_ADDON=/tmp/tcur.node NERVA_DEVICE_TRACE="$AB/trace.bin" NERVA_RUN_AHEAD_STEPS=$k timeout 120 \
    $AB_NODE $BENCH /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> "$AB/err.log"
  python3 tools/gpu/trace_timeline.py "$AB/trace.bin" --tokens 24 > "$AB/timeline-k$k.txt" 2>&1
  rm -f "$AB/trace.bin"
  echo "== k$k"; head -25 "$AB/timeline-k$k.txt" | grep "^step"
  grep -A12 "per kernel" "$AB/timeline-k$k.txt"
done
for i in 1 2; do
  ab_run k1 cur NERVA_RUN_AHEAD_STEPS=1
  ab_run k4 cur NERVA_RUN_AHEAD_STEPS=4
done
ab_report
ab_pack call2
