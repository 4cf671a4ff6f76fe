#!/usr/bin/env bash
# Session 27 call 5: the final tree (t1) at one and four steps a replay against 06391b4's kernels
# at one (cur), five rounds alternating; a traced step of t1 (the tail: two kernels fewer).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" t1=.device/t1 cur=.device/cur
export BENCH=.device/dist6/bench.mjs
for i in 1 2 3 4 5; do
  ab_run cur-k1 cur NERVA_RUN_AHEAD_STEPS=1
  ab_run t1-k1 t1 NERVA_RUN_AHEAD_STEPS=1
  ab_run t1-k4 t1 NERVA_RUN_AHEAD_STEPS=4
done
ab_report
xz -dc .device/tt1/nerva_cuda.node.xz > /tmp/tt1.node
ab_trace tt1 /tmp/tt1.node NERVA_RUN_AHEAD_STEPS=1
head -8 $AB/timeline-tt1.txt | tail -2
ab_pack call5
