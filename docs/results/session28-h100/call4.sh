#!/usr/bin/env bash
# Session 28 call 4: the committed tree (s6 = 074c3d8's kernels) against session 27's (t1), the
# attention's cluster size re-measured now that its merge is cheaper (NERVA_ATTN_SHORT 4, 16),
# and the other shapes: bf16 KV, prompts 896 and 1536, the 8B.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" s6=.device/s6 t1=.device/t1
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3; do
  ab_run s6 s6
  ab_run t1 t1
  ab_run s6-attn16 s6 NERVA_ATTN_SHORT=16
  ab_run s6-attn4 s6 NERVA_ATTN_SHORT=4
done
ab_run s6 s6
ab_run s6 s6
ab_run s6-bf16 s6 NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run s6-896 s6
PL=1536 GEN=128 ab_run s6-1536 s6
M=qwen3-8b GEN=64 ab_run s6-8b s6
ab_report
ab_pack call4
