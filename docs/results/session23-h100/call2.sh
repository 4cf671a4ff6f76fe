#!/usr/bin/env bash
# Session 23 call 2: traced timelines, split-KV attention against k_attn_decode_short (8 x 64)
source tools/gpu/ab.sh
ab_setup "qwen3-0.6b" new=.device/addon
xz -dc .device/addon/trace.node.xz > /tmp/trace.node
for g in 0 8; do
  OUT=$AB/x NERVA_CUDA_ADDON=/tmp/trace.node NERVA_ATTN_SHORT=$g NERVA_ATTN_SHORT_CAP=64 NERVA_DEVICE_TRACE=$AB/trace.bin timeout 120 $AB_NODE .device/dist/bench.mjs /tmp/synth/qwen3-0.6b 128 256 > /dev/null 2>> $AB/err.log
  python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 > $AB/timeline-s$g.txt 2>&1
  for k in k_attn_decode_short k_attn_partial_rope k_gemv_wide k_gemv_bf16; do
    python3 tools/gpu/trace_timeline.py $AB/trace.bin --tokens 6 --detail $k > $AB/timeline-s$g-$k.txt 2>&1
  done
  rm -f $AB/trace.bin
  sed -n 1,20p $AB/timeline-s$g.txt | cut -c1-150
  grep -A14 "per kernel" $AB/timeline-s$g.txt
done
grep -v "^ *[0-9]* k_" $AB/timeline-s8-k_attn_decode_short.txt | head -30
head -50 $AB/timeline-s8-k_attn_decode_short.txt | cut -c1-160
tail -5 $AB/err.log
ab_pack call2
