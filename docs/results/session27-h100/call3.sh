#!/usr/bin/env bash
# Session 27 call 3: replays of several steps with two sizes only (runAheadSteps or 1, default
# runAheadMs 8): call 2's trace found the steps faster in replays of 4, call 1's loss being the
# graphs captured mid-run (k switching between 3 and 4 near the old 5 ms bound). Default (4)
# against NERVA_RUN_AHEAD_STEPS=1, alternating, same addon; other shapes; conformance.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" cur=.device/cur
export BENCH=.device/dist5/bench.mjs
for i in 1 2 3 4; do
  ab_run k1 cur NERVA_RUN_AHEAD_STEPS=1
  ab_run k4 cur
done
ab_run k8 cur NERVA_RUN_AHEAD_STEPS=8
ab_run k1-bf16 cur NERVA_RUN_AHEAD_STEPS=1 NERVA_KV_DTYPE=bf16
ab_run k4-bf16 cur NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run k1-896 cur NERVA_RUN_AHEAD_STEPS=1
PL=896 GEN=128 ab_run k4-896 cur
PL=1536 GEN=128 ab_run k1-1536 cur NERVA_RUN_AHEAD_STEPS=1
PL=1536 GEN=128 ab_run k4-1536 cur
M=qwen3-8b GEN=64 ab_run k1-8b cur NERVA_RUN_AHEAD_STEPS=1
M=qwen3-8b GEN=64 ab_run k4-8b cur
ab_report
grep -o '"tag":"[^"]*"\|"decode_graphs":[^]]*]' $AB/bench.jsonl | paste - - | sort | uniq -c
DIST=.device/dist5 ab_check cur
ab_pack call3
