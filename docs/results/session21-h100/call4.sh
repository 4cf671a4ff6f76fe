#!/usr/bin/env bash
# Session 21 call 4: the attention change alone (packed bf16 keys until use, ccbbf19): head (a7df150) vs new
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon head=.device/addon-head
for i in 1 2 3; do
  ab_run head-f32 head; ab_run new-f32 new
  ab_run head-bf16 head NERVA_KV_DTYPE=bf16; ab_run new-bf16 new NERVA_KV_DTYPE=bf16
done
for a in head new; do
  PL=1536 GEN=128 ab_run $a-f32-1536 $a
  PL=1536 GEN=128 ab_run $a-bf16-1536 $a NERVA_KV_DTYPE=bf16
  PL=4000 GEN=128 ab_run $a-f32-4000 $a
  PL=4000 GEN=128 ab_run $a-bf16-4000 $a NERVA_KV_DTYPE=bf16
done
ab_report; ab_check new; ab_pack call4
