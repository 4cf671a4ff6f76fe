#!/usr/bin/env bash
# Session 21 call 6: the rotary angles from a per-step table (experiment-rope-table.patch): base (fdd460e) vs new
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b qwen3-8b" new=.device/addon head=.device/addon-head
for i in 1 2 3; do ab_run base head; ab_run new new; done
for a in head new; do
  ab_run $a-bf16 $a NERVA_KV_DTYPE=bf16
  PL=1536 GEN=128 ab_run $a-1536 $a
  PL=4000 GEN=128 ab_run $a-4000 $a
  M=qwen3-8b GEN=64 ab_run $a-8b $a
done
ab_run base head; ab_run new new
ab_report; ab_check new; ab_pack call6
