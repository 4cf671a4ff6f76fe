#!/usr/bin/env bash
# Session 27 call 8: the final tree (addon t1 = this tree's kernels; bundles of this tree: the
# decode probe's warm-up now captures the measured run's graphs). 0.6B 128/256 five times,
# bf16 KV, prompts 896 and 1536 at four steps a replay and one, the 8B; conformance, invariance.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" t1=.device/t1
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3 4 5; do ab_run final t1; done
ab_run final-bf16 t1 NERVA_KV_DTYPE=bf16
ab_run final-bf16-k1 t1 NERVA_KV_DTYPE=bf16 NERVA_RUN_AHEAD_STEPS=1
PL=896 GEN=128 ab_run final-896 t1
PL=896 GEN=128 ab_run final-896-k1 t1 NERVA_RUN_AHEAD_STEPS=1
PL=1536 GEN=128 ab_run final-1536 t1
PL=1536 GEN=128 ab_run final-1536-k1 t1 NERVA_RUN_AHEAD_STEPS=1
M=qwen3-8b GEN=64 ab_run final-8b t1
ab_report
DIST=.device/dist7 ab_check t1
ab_pack call8
