#!/usr/bin/env bash
# Session 23 call 9: the cluster attention with 8 warps a block (SA_THREADS 256: a block's 8-key
# batches spread over twice the warps) against 4 warps (call 8's build) and the split kernel.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" w8=.device/addon w4=.device/addon128
for i in 1 2 3; do
  ab_run off w4 NERVA_ATTN_SHORT=0
  ab_run w4 w4
  ab_run w8 w8
done
PL=640 GEN=128 ab_run w4-768 w4
PL=640 GEN=128 ab_run w8-768 w8
ab_run w4-bf16 w4 NERVA_KV_DTYPE=bf16
ab_run w8-bf16 w8 NERVA_KV_DTYPE=bf16
ab_report
ab_check w8
grep -i "fail" $AB/conf.log | head -20
tail -3 $AB/err.log
ab_pack call9
