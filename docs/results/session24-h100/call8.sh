#!/usr/bin/env bash
# Session 24 call 8: clusters of 16 blocks (NERVA_ATTN_SHORT=16) now that every SM has room for an
# attention block beside qkv (session 23 measured 16 at 3.5 % slower, before the qkv bound): half
# the keys a block, one batch a warp up to 512 keys; against 8 (default) and 4. Call 5's build, its
# L2 prefetch off (NERVA_ATTN_KV_PREFETCH=0: the committed tree).
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
for i in 1 2 3; do
  ab_run c8 new NERVA_ATTN_KV_PREFETCH=0
  ab_run c16 new NERVA_ATTN_KV_PREFETCH=0 NERVA_ATTN_SHORT=16
done
ab_run c4 new NERVA_ATTN_KV_PREFETCH=0 NERVA_ATTN_SHORT=4
ab_run c16-head new NERVA_ATTN_KV_PREFETCH=0 NERVA_ATTN_SHORT=16 NERVA_GEMV_LEAN=0
PL=896 GEN=128 ab_run c8-896 new NERVA_ATTN_KV_PREFETCH=0
PL=896 GEN=128 ab_run c16-896 new NERVA_ATTN_KV_PREFETCH=0 NERVA_ATTN_SHORT=16
ab_run bf16-c8 new NERVA_ATTN_KV_PREFETCH=0 NERVA_KV_DTYPE=bf16
ab_run bf16-c16 new NERVA_ATTN_KV_PREFETCH=0 NERVA_KV_DTYPE=bf16 NERVA_ATTN_SHORT=16
ab_report
tail -3 $AB/err.log
ab_pack call8
