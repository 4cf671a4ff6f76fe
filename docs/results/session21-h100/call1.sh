#!/usr/bin/env bash
# Session 21 call 1: NERVA_GEMV_L2PRE variants (experiment-gemv-l2pre.patch built as .device/addon), bf16 KV
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon head=.device/addon-head
for i in 1 2; do
  ab_run head head
  ab_run new0 new
  for v in 0010 0020 0100 0110 0120 1111 2222 0011 1000 0001; do ab_run l2-$v new NERVA_GEMV_L2PRE=$v; done
  ab_run early2-0020 new NERVA_DECODE_EARLY=2 NERVA_GEMV_L2PRE=0020
  ab_run kvbf16 new NERVA_KV_DTYPE=bf16
done
ab_report; ab_pack call1
