#!/usr/bin/env bash
# Session 23 call 7: where k_attn_decode_short (8 blocks a KV head, keys in one pass) stops
# paying against the split-KV kernel: contexts up to 512, 768 and 1024 keys.
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" new=.device/addon
for i in 1 2; do
  PL=384 GEN=128 ab_run base-512 new
  PL=384 GEN=128 ab_run s8-512 new NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=64
  PL=640 GEN=128 ab_run base-768 new
  PL=640 GEN=128 ab_run s8-768 new NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=96
  PL=896 GEN=128 ab_run base-1024 new
  PL=896 GEN=128 ab_run s8-1024 new NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=128
done
PL=640 GEN=128 ab_run bf16-base-768 new NERVA_KV_DTYPE=bf16
PL=640 GEN=128 ab_run bf16-s8-768 new NERVA_KV_DTYPE=bf16 NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=96
M=qwen3-8b GEN=64 ab_run 8b-base new
M=qwen3-8b GEN=64 ab_run 8b-s8 new NERVA_ATTN_SHORT=8 NERVA_ATTN_SHORT_CAP=32
ab_report
ab_pack call7
