#!/usr/bin/env bash
# Session 26 call 4: more barriers off the chains, same bits, against n3a (2a2fa90). n4: the
# cluster attention's warp weights taken by every warp and spread by shuffles (no barrier before
# the push) and its slice merged by warp 0 behind a warp barrier (NERVA_EXP_ATTN=1); n4b: only
# the latter (=2); n5: o's and down's KS warps of an output meet at a named barrier of their own
# (NERVA_EXP_WIDE=1). The 8B at 128/64: bf1d647 (h, its bundle), n3a, n5.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" n3a=.device/n3a n4=.device/n4 n4b=.device/n4b n5=.device/n5 h=.device/h
export BENCH=.device/dist2/bench.mjs
for i in 1 2 3; do
  ab_run n3a n3a
  ab_run n4 n4
  ab_run n4b n4b
  ab_run n5 n5
done
M=qwen3-8b GEN=64 BENCH=.device/dist/bench.mjs ab_run h-8b h
M=qwen3-8b GEN=64 ab_run n3a-8b n3a
M=qwen3-8b GEN=64 ab_run n5-8b n5
ab_report
ab_pack call4
