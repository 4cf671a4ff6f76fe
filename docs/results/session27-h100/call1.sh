#!/usr/bin/env bash
# Session 27 call 1: decode replays of several steps (EngineOptions.runAheadSteps, default 4)
# against one step a replay (NERVA_RUN_AHEAD_STEPS=1: the engine before this session), same addon
# (06391b4's kernels), alternating.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" cur=.device/cur
export BENCH=.device/dist4/bench.mjs
for i in 1 2 3 4; do
  ab_run k1 cur NERVA_RUN_AHEAD_STEPS=1
  ab_run k4 cur
done
for s in 2 8; do ab_run k$s cur NERVA_RUN_AHEAD_STEPS=$s; done
ab_run k1-bf16 cur NERVA_RUN_AHEAD_STEPS=1 NERVA_KV_DTYPE=bf16
ab_run k4-bf16 cur NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run k1-896 cur NERVA_RUN_AHEAD_STEPS=1
PL=896 GEN=128 ab_run k4-896 cur
M=qwen3-8b GEN=64 ab_run k1-8b cur NERVA_RUN_AHEAD_STEPS=1
M=qwen3-8b GEN=64 ab_run k4-8b cur
ab_report
grep -o '"decode_graphs":[^]]*]' $AB/bench.jsonl | sort | uniq -c
ab_pack call1
