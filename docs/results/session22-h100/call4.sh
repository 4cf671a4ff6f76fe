#!/usr/bin/env bash
# Session 22 call 4: the decode group with its first keys loaded before the qkv phase (attnPartial's
# onWait), against the two kernels; traced timeline of the group
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for i in 1 2 3; do
  ab_run off-f32 new NERVA_DECODE_GROUP=0; ab_run g16-f32 new NERVA_DECODE_GROUP=16
done
ab_run off-bf16 new NERVA_DECODE_GROUP=0 NERVA_KV_DTYPE=bf16; ab_run g16-bf16 new NERVA_KV_DTYPE=bf16 NERVA_DECODE_GROUP=16
ab_report
g=16
OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_DECODE_GROUP=$g NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-g$g.txt 2>&1
python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail k_decode_group > $AB/timeline-g$g-k_decode_group.txt 2>&1
rm -f $AB/trace.bin
grep -A10 "per kernel" $AB/timeline-g$g.txt
grep "grid 128" $AB/timeline-g$g-k_decode_group.txt | tail -4
NERVA_DECODE_GROUP=16 ab_check new
ab_pack call4
