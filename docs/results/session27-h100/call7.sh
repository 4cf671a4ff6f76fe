#!/usr/bin/env bash
# Session 27 call 7 (experiment): layer 0's attention waits ~2.5 µs for SMs in a small shared-
# memory configuration (session 26). The attention's blocks hold 128 keys (153 KB, the 164 KB
# configuration); NERVA_SA_CAP=64 holds 64 (82 KB: the 100 KB configuration fits it beside two
# qkv blocks); NERVA_LMHEAD_CARVEOUT=P asks the LM head (the step's last wide kernel) for P % of
# the carveout, so the next step starts in it. x1 = this tree plus the two knobs; alternating.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" x1=.device/x1
export BENCH=.device/dist6/bench.mjs
for i in 1 2 3; do
  ab_run base x1
  ab_run cap64 x1 NERVA_SA_CAP=64
  ab_run carve44 x1 NERVA_LMHEAD_CARVEOUT=44
  ab_run cap64-carve44 x1 NERVA_SA_CAP=64 NERVA_LMHEAD_CARVEOUT=44
  ab_run cap64-carve58 x1 NERVA_SA_CAP=64 NERVA_LMHEAD_CARVEOUT=58
done
ab_report
xz -dc .device/tx1/nerva_cuda.node.xz > /tmp/tx1.node
ab_trace base /tmp/tx1.node NERVA_RUN_AHEAD_STEPS=1
ab_trace cap64-carve44 /tmp/tx1.node NERVA_RUN_AHEAD_STEPS=1 NERVA_SA_CAP=64 NERVA_LMHEAD_CARVEOUT=44
for t in base cap64-carve44; do sed -n 7,9p $AB/timeline-$t.txt; done
ab_pack call7
