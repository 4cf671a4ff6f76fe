#!/usr/bin/env bash
# Session 26 call 3: barriers off the post-wait chains, same bits. n3a: a one-row normed GEMV
# (qkv, gate_up, LM head at batch 1) keeps its float4 in registers and every thread sums the
# warps' squares itself (one barrier and one shared-memory pass fewer); n3: that and the cluster
# attention's warp weights taken by every warp (no barrier before the push) and its slice merged
# by warp 0 behind a warp barrier. Against n2 (call 2's kernels) and bf1d647 (h, with its bundle).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" h=.device/h n2=.device/n2 n3a=.device/n3a n3=.device/n3
for i in 1 2 3; do
  ab_run h h
  BENCH=.device/dist2/bench.mjs ab_run n2 n2
  BENCH=.device/dist2/bench.mjs ab_run n3a n3a
  BENCH=.device/dist2/bench.mjs ab_run n3 n3
done
export BENCH=.device/dist2/bench.mjs
ab_run bf16-n2 n2 NERVA_KV_DTYPE=bf16
ab_run bf16-n3 n3 NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run n2-896 n2
PL=896 GEN=128 ab_run n3-896 n3
PL=1536 GEN=128 ab_run n2-1536 n2
PL=1536 GEN=128 ab_run n3-1536 n3
ab_report
ab_check n3
grep -i "fail" $AB/conf.log | head -20
ab_pack call3
