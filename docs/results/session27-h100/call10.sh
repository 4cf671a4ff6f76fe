#!/usr/bin/env bash
# Session 27 call 10 (experiment): the o projection folded into the cluster attention's epilogue
# (OFuse: each cluster's outputs times its W_o columns, 8 partials that gate_up's norm and
# down's epilogue add to x): "of" against NERVA_ATTN_OFUSE=0 in the same addon, alternating;
# conformance and invariance on it.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" of=.device/of
export BENCH=.device/dist7/bench.mjs
for i in 1 2 3; do
  ab_run ofuse of
  ab_run ounfused of NERVA_ATTN_OFUSE=0
done
ab_run ofuse-bf16 of NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run ofuse-896 of
ab_report
DIST=.device/dist7 ab_check of
grep -i "fail" $AB/conf.log | head -10
ab_pack call10
