#!/usr/bin/env bash
# Session 22 call 1: the decode group (qkv + attention as one kernel of clusters) vs the two kernels
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon head=.device/addon-head
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
ab_run probe-g16 new NERVA_DECODE_GROUP=16
ab_run probe-off new NERVA_DECODE_GROUP=0
ab_run probe-g8 new NERVA_DECODE_GROUP=8
ab_report
for i in 1 2 3; do
  ab_run head-f32 head; ab_run off-f32 new NERVA_DECODE_GROUP=0; ab_run new-f32 new
done
for i in 1 2; do
  ab_run off-bf16 new NERVA_DECODE_GROUP=0 NERVA_KV_DTYPE=bf16; ab_run new-bf16 new NERVA_KV_DTYPE=bf16
done
ab_run g8-f32 new NERVA_DECODE_GROUP=8
for a in off new; do
  v=""; [ $a = off ] && v=NERVA_DECODE_GROUP=0
  PL=1536 GEN=128 ab_run $a-f32-1536 new $v
  PL=4000 GEN=128 ab_run $a-f32-4000 new $v
  PL=1536 GEN=128 ab_run $a-bf16-1536 new $v NERVA_KV_DTYPE=bf16
done
ab_report; ab_check new; ab_pack call1
