#!/usr/bin/env bash
# Session 21 call 7: bf16 KV with eight keys a warp (experiment-packed-kb8.patch): base (fdd460e) vs new
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" new=.device/addon head=.device/addon-head
for i in 1 2; do
  for a in head new; do
    ab_run $a-f32 $a
    ab_run $a-bf16 $a NERVA_KV_DTYPE=bf16
    PL=1536 GEN=128 ab_run $a-bf16-1536 $a NERVA_KV_DTYPE=bf16
    PL=4000 GEN=128 ab_run $a-bf16-4000 $a NERVA_KV_DTYPE=bf16
  done
done
for a in head new; do
  PL=4000 GEN=128 ab_run $a-f32-4000 $a
  M=qwen3-8b GEN=64 ab_run $a-8b-bf16 $a NERVA_KV_DTYPE=bf16
  M=qwen3-8b PL=4000 GEN=32 ab_run $a-8b-bf16-4000 $a NERVA_KV_DTYPE=bf16
  ab_run $a-f32 $a
done
ab_report; ab_check new; ab_pack call7
