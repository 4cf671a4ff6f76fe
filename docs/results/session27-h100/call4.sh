#!/usr/bin/env bash
# Session 27 call 4: op sample's push and advance folded into k_sample_cluster for a one-row
# step (t1: this tree; NERVA_SAMPLE_TAIL=0 runs the separate kernels in the same addon) against
# cur (06391b4's kernels), at one and four steps a replay, alternating; conformance on t1.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" t1=.device/t1 cur=.device/cur
export BENCH=.device/dist6/bench.mjs
for i in 1 2 3; do
  ab_run cur-k1 cur NERVA_RUN_AHEAD_STEPS=1
  ab_run t1-k1 t1 NERVA_RUN_AHEAD_STEPS=1
  ab_run t1off-k1 t1 NERVA_RUN_AHEAD_STEPS=1 NERVA_SAMPLE_TAIL=0
  ab_run t1-k4 t1 NERVA_RUN_AHEAD_STEPS=4
done
ab_run t1-k4-bf16 t1 NERVA_KV_DTYPE=bf16 NERVA_RUN_AHEAD_STEPS=4
ab_run t1-k1-bf16 t1 NERVA_KV_DTYPE=bf16 NERVA_RUN_AHEAD_STEPS=1
ab_run cur-k1-bf16 cur NERVA_KV_DTYPE=bf16 NERVA_RUN_AHEAD_STEPS=1
PL=896 GEN=128 ab_run t1-k1-896 t1 NERVA_RUN_AHEAD_STEPS=1
PL=896 GEN=128 ab_run cur-k1-896 cur NERVA_RUN_AHEAD_STEPS=1
M=qwen3-8b GEN=64 ab_run t1-8b t1
ab_report
DIST=.device/dist6 ab_check t1
ab_pack call4
