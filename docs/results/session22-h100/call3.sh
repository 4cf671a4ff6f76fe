#!/usr/bin/env bash
# Session 22 call 3: traced timelines of the decode group (NERVA_DECODE_GROUP=16) against the two kernels
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for g in 0 16; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_DECODE_GROUP=$g NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-g$g.txt 2>&1
  for k in k_decode_group k_attn_partial_rope k_gemv_wide; do
    python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail $k > $AB/timeline-g$g-$k.txt 2>&1
  done
  rm -f $AB/trace.bin
  sed -n 1,20p $AB/timeline-g$g.txt | cut -c1-150
  grep -A14 "per kernel" $AB/timeline-g$g.txt
done
grep -v "^ *[0-9]* k_" $AB/timeline-g16-k_decode_group.txt | head -40
tail -5 $AB/err.log
ab_pack call3
