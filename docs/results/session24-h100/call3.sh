#!/usr/bin/env bash
# Session 24 call 3: the landed qkv bound (NERVA_GEMV_LEAN, default on) against the head's
# behaviour, and cluster attention blocks of 2 warps (NERVA_ATTN_SHORT_WARPS=2: 8 K registers,
# which fit beside two unbounded qkv blocks) with clusters of 8 and 16; then the checks.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
for i in 1 2; do
  ab_run head new NERVA_GEMV_LEAN=0
  ab_run lean new
  ab_run w2 new NERVA_GEMV_LEAN=0 NERVA_ATTN_SHORT_WARPS=2
  ab_run w2c16 new NERVA_GEMV_LEAN=0 NERVA_ATTN_SHORT_WARPS=2 NERVA_ATTN_SHORT=16
done
ab_run w2lean new NERVA_ATTN_SHORT_WARPS=2
ab_run bf16-head new NERVA_KV_DTYPE=bf16 NERVA_GEMV_LEAN=0
ab_run bf16-lean new NERVA_KV_DTYPE=bf16
PL=896 GEN=128 ab_run head-896 new NERVA_GEMV_LEAN=0
PL=896 GEN=128 ab_run lean-896 new
PL=896 GEN=128 ab_run w2c16-896 new NERVA_GEMV_LEAN=0 NERVA_ATTN_SHORT_WARPS=2 NERVA_ATTN_SHORT=16
ab_report
ab_check new
grep -i "fail" $AB/conf.log | head -20
tail -3 $AB/err.log
ab_pack call3
