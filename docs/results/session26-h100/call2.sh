#!/usr/bin/env bash
# Session 26 call 2: the kernels of call 1 without the layer-0 trigger (n2) against bf1d647 (h),
# and with the engine's step ahead starting at the end event of the step before it (one timed
# event record between two replays instead of two: the bench bundle of this tree, dist2).
# NERVA_RING_FENCE=0 (the ring push without its system fence) only to size that fence. The
# graph-gap microbenchmark again, with events recorded inside the graph.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" h=.device/h n=.device/n2
.device/micro/graphgap > $AB/graphgap.txt 2>&1; cat $AB/graphgap.txt
for i in 1 2 3; do
  ab_run h h
  ab_run n n
  BENCH=.device/dist2/bench.mjs ab_run n-ev n
done
BENCH=.device/dist2/bench.mjs ab_run n-ev-nofence n NERVA_RING_FENCE=0
ab_run bf16-h h NERVA_KV_DTYPE=bf16
BENCH=.device/dist2/bench.mjs ab_run bf16-n-ev n NERVA_KV_DTYPE=bf16
PL=1536 GEN=128 ab_run h-1536 h
PL=1536 GEN=128 BENCH=.device/dist2/bench.mjs ab_run n-ev-1536 n
ab_report
ab_pack call2
