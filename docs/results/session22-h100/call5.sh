#!/usr/bin/env bash
# Session 22 call 5: the decode group lets o and gate_up launch only after its qkv phase
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
for i in 1 2 3; do
  ab_run off-f32 new NERVA_DECODE_GROUP=0; ab_run g16-f32 new NERVA_DECODE_GROUP=16
done
ab_run g8-f32 new NERVA_DECODE_GROUP=8
ab_report
ab_pack call5
