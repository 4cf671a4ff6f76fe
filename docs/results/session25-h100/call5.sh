#!/usr/bin/env bash
# Session 25 call 5 (experiment): o and down as one warp an output holding its whole row
# (NERVA_WIDE_KS1=1: k_gemv_wide<1, 8, P>, 256 threads of 60 / 80 registers) against the
# default split blocks (512 threads of 46, 768 of 44): fewer registers in all, so gate_up's blocks
# fit beside the attention's and o's, and down's beside gate_up's.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" k1=.device/k1
for i in 1 2 3; do
  ab_run off k1
  ab_run ks1 k1 NERVA_WIDE_KS1=1
done
ab_run bf16-off k1 NERVA_KV_DTYPE=bf16
ab_run bf16-ks1 k1 NERVA_KV_DTYPE=bf16 NERVA_WIDE_KS1=1
PL=896 GEN=128 ab_run off-896 k1
PL=896 GEN=128 ab_run ks1-896 k1 NERVA_WIDE_KS1=1
ab_report
ab_pack call5
